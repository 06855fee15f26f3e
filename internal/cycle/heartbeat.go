package cycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/stores"
)

// beats extends the leases of running effects. One goroutine per cycle
// does it for every claim in flight: registering a claim is a list
// insert, so a short handler pays no timer and no goroutine of its own.
// The goroutine starts with the first claim and exits once no claim has
// been in flight for a tick, so an idle cycle runs nothing and needs no
// Close.
type beats struct {
	cycle *Cycle

	mu      sync.Mutex
	head    Beat // sentinel of a circular list of the claims in flight
	n       int
	running bool
	// lastTick is when the loop last looked at the claims (or started).
	lastTick time.Time
	due      []*Beat // reused by the loop
}

// Beat is one claim in flight. It is also the handler's context: the
// message context, cancelled with stores.ErrLostClaim when the lease is
// lost, and carrying the claim (ClaimFromContext).
//
// Its cancellable part is made lazily: a handler that never asks for
// Done (most short handlers) costs no context allocation. The first Done,
// a lost lease, or a child context derived from it creates it.
type Beat struct {
	parent     context.Context
	prev, next *Beat
	c          *stores.Claim
	extendedAt time.Time // guarded by beats.mu

	mu      sync.Mutex // held while an Extend is in flight
	stopped bool
	lost    bool
	// extending is set while an Extend of this claim is scheduled or in
	// flight: the loop skips the claim's ticks until it ends, so a store
	// slower than the heartbeat costs one goroutine, not one per tick.
	extending atomic.Bool
	// completing is set once the handler succeeded and its Complete may
	// be in flight: an Extend refused then is the Complete having landed,
	// not a lost lease.
	completing atomic.Bool

	cmu      sync.Mutex // guards the fields below
	ctx      context.Context
	cancel   context.CancelCauseFunc
	finished bool
}

var _ context.Context = (*Beat)(nil)

// cancellable returns the cancellable context, creating it if needed. A
// context created after the handler finished is cancelled at once, as the
// eagerly created one would have been.
func (e *Beat) cancellable() context.Context {
	e.cmu.Lock()
	defer e.cmu.Unlock()
	return e.cancellableLocked()
}

func (e *Beat) cancellableLocked() context.Context {
	if e.ctx == nil {
		e.ctx, e.cancel = context.WithCancelCause(e.parent)
		if e.finished {
			e.cancel(nil)
		}
	}
	return e.ctx
}

// current returns the context that answers Err and Value: the cancellable
// one if it exists or the handler has returned (then it is cancelled, so
// that a goroutine the handler left behind sees Err), else the parent.
func (e *Beat) current() context.Context {
	e.cmu.Lock()
	defer e.cmu.Unlock()
	if e.ctx != nil || e.finished {
		return e.cancellableLocked()
	}
	return e.parent
}

// lose cancels the handler's context with cause.
func (e *Beat) lose(cause error) {
	e.cmu.Lock()
	e.cancellableLocked()
	e.cancel(cause)
	e.cmu.Unlock()
}

// finish cancels the handler's context once the handler has returned,
// releasing what derived contexts hold.
func (e *Beat) finish() {
	e.cmu.Lock()
	e.finished = true
	if e.cancel != nil {
		e.cancel(nil)
	}
	e.cmu.Unlock()
}

// Deadline implements context.Context.
func (e *Beat) Deadline() (time.Time, bool) { return e.parent.Deadline() }

// Done implements context.Context.
func (e *Beat) Done() <-chan struct{} { return e.cancellable().Done() }

// Err implements context.Context.
func (e *Beat) Err() error { return e.current().Err() }

// Value returns the claim for ClaimFromContext, and otherwise the value
// of the message context. context.Cause and derived contexts find the
// cancellable context through it.
func (e *Beat) Value(key any) any {
	if key == (claimKey{}) {
		return e.c
	}
	return e.current().Value(key)
}

// Detached returns the Beat's parent context without its cancellation
// and deadline (context.WithoutCancel): the context of the Complete that
// follows the effect. It does not carry the claim.
func (e *Beat) Detached() context.Context { return context.WithoutCancel(e.parent) }

// maxTick bounds the loop's period, so an idle loop exits soon and due
// claims are found with little delay; minTick keeps a heartbeat shorter
// than two of them (a nanosecond is valid) from spinning the loop.
const (
	maxTick = 50 * time.Millisecond
	minTick = time.Millisecond
)

func (b *beats) every() time.Duration { return b.cycle.p.Tuning.Heartbeat }

func (b *beats) tick() time.Duration {
	return max(min(b.every()/2, maxTick), minTick)
}

func (b *beats) add(e *Beat) {
	if b.every() <= 0 {
		return
	}
	b.mu.Lock()
	if b.head.next == nil {
		b.head.next, b.head.prev = &b.head, &b.head
	}
	if !b.running {
		b.running = true
		b.lastTick = time.Now()
		go b.loop()
	}
	// The loop's last tick (or its start) is before now: extending from
	// it may come early, never late, and saves a clock read per message.
	e.extendedAt = b.lastTick
	e.prev, e.next = b.head.prev, &b.head
	b.head.prev.next = e
	b.head.prev = e
	b.n++
	b.mu.Unlock()
}

// remove unregisters e, waiting for an Extend in flight so that no Extend
// can race with the Complete or Release that follows.
func (b *beats) remove(e *Beat) {
	if b.every() <= 0 {
		return
	}
	b.mu.Lock()
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
	b.n--
	b.mu.Unlock()
	// Unlinked, e is picked by no later tick. A tick that picked it
	// before set extending under b.mu, which stays set until that Extend
	// has returned and released e.mu: only then is there one to wait for
	// (or to stop before it starts). Most claims end between ticks and
	// skip the lock.
	if e.extending.Load() {
		e.mu.Lock()
		e.stopped = true
		e.mu.Unlock()
	}
}

func (b *beats) loop() {
	t := time.NewTicker(b.tick())
	defer t.Stop()
	idle := false
	for range t.C {
		b.mu.Lock()
		if b.n == 0 {
			if idle {
				b.running = false
				b.mu.Unlock()
				return
			}
			idle = true
			b.mu.Unlock()
			continue
		}
		idle = false
		now := time.Now()
		b.lastTick = now
		b.due = b.due[:0]
		for e := b.head.next; e != &b.head; e = e.next {
			if now.Sub(e.extendedAt) >= b.every() && e.extending.CompareAndSwap(false, true) {
				e.extendedAt = now
				b.due = append(b.due, e)
			}
		}
		due := b.due
		b.mu.Unlock()
		for _, e := range due {
			// Concurrently: one slow Extend must not delay the others past
			// their leases.
			go b.extend(e)
		}
	}
}

func (b *beats) extend(e *Beat) {
	defer e.extending.Store(false)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped || e.lost {
		return
	}
	c := b.cycle
	err := c.extend(e.parent, e.c)
	switch {
	case errors.Is(err, stores.ErrLostClaim) && e.completing.Load():
		// The Complete landed first (the record is done): nothing to
		// extend any more. A claim really lost meanwhile is for the
		// Complete to find out.
		e.lost = true
	case errors.Is(err, stores.ErrLostClaim):
		// Someone took the message over: tell the handler to stop.
		e.lost = true
		// Counted once, by the Release or Complete that follows.
		c.p.Logger.Error(c.side.LostLease, err, watermill.LogFields{"scope": e.c.Scope, "keys": e.c.Keys})
		e.lose(err)
	case err != nil:
		c.Observe(e.c.Scope, dedup.OutcomeStoreError)
		c.p.Logger.Error("Dedup lease extension failed; retrying at the next heartbeat", err, watermill.LogFields{"scope": e.c.Scope, "keys": e.c.Keys})
	}
}

type claimKey struct{}

// ClaimFromContext returns the claim a Beat context (or one derived from
// it) carries.
func ClaimFromContext(ctx context.Context) (*stores.Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(*stores.Claim)
	return c, ok
}

// Hold registers cl with the heartbeat, which extends its lease every
// Tuning.Heartbeat until Drop, and returns the Beat, a context derived
// from parent that carries cl and is cancelled with stores.ErrLostClaim
// when the lease is found lost.
func (c *Cycle) Hold(parent context.Context, cl *stores.Claim) *Beat {
	e := &Beat{c: cl, parent: parent}
	c.beats.add(e)
	return e
}

// serially runs call with no Extend of e's claim in flight: the
// heartbeat's Extend waits for it, and it for an Extend in flight.
func (e *Beat) serially(call func() error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return call()
}

// Completing marks the effect done and its Complete possibly in flight:
// an Extend refused from now on is the Complete having landed, not a
// lost lease.
func (e *Beat) Completing() { e.completing.Store(true) }

// Drop unregisters e, waiting for an Extend in flight so that none races
// with the Complete or Release that follows, and cancels its context.
func (c *Cycle) Drop(e *Beat) {
	c.beats.remove(e)
	e.finish()
}
