package middleware

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

// pending tracks the Completes running in the background under
// ModeAsyncComplete: how many, so that Close can wait for them, and which
// keys, so that a duplicate of a message whose Complete is still on its
// way waits for it instead of being nacked as in progress.
type pending struct {
	// stop ends the retries of the Completes still running when Close
	// gives up waiting.
	stop   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed once n is 0 after Close
	// keys maps each (scope, key) in flight to the flight completing it.
	keys map[flightKey]*flight
	// landings counts the flights that have ended.
	landings atomic.Uint64
	// work hands a Complete to an idle completer goroutine: unbuffered,
	// so that a send succeeds only when one is waiting.
	work chan *flight
	// linger carries Tuning.CompleteLinger to the store (stores.WithLinger)
	// in every background Complete's context: a store that batches sends
	// the Complete with its next call.
	linger context.Context
}

// flight is one background Complete: what it records, and the keys it
// holds meanwhile. One allocation carries it all, the Complete's context
// included.
type flight struct {
	scope string
	keys  []string
	// done is closed when the Complete has landed or given up; made by
	// the first landing that waits for it (under pending.mu), so that a
	// flight nobody waits for makes no channel.
	done chan struct{}

	m    *Middleware
	msg  *message.Message
	hb   *cycle.Beat
	data []byte
	ctx  completeCtx
}

// completeCtx is the context of a background Complete: the values of the
// message's context as the handler got it, detached from its
// cancellation (the subscriber may cancel it after the ack), and
// cancelled when Close gives up waiting (pending.stop) — what
// context.WithCancel(context.WithoutCancel(msgCtx)) stopped by an
// AfterFunc on pending.stop was, without their allocations and locks.
type completeCtx struct {
	values context.Context // hb.Detached(): the message's values, no cancellation
	stop   context.Context
	// linger is pending.linger: stores.WithLinger's value, looked up
	// before the message's.
	linger context.Context
}

var _ context.Context = (*completeCtx)(nil)

func (c *completeCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *completeCtx) Done() <-chan struct{}       { return c.stop.Done() }
func (c *completeCtx) Err() error                  { return c.stop.Err() }

// Value returns the message's values (values hides the message context's
// cancellation from the context package's lookups, as WithoutCancel
// does: context.Cause falls back to Err).
func (c *completeCtx) Value(key any) any {
	if v := c.linger.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// AfterFunc lets a context derived from this one (a store call's
// timeout) be cancelled with stop without a goroutine of its own: the
// context package uses a parent's AfterFunc method when it has one.
func (c *completeCtx) AfterFunc(f func()) func() bool { return context.AfterFunc(c.stop, f) }

func (c *completeCtx) String() string { return "middleware.completeCtx" }

// run completes f in the background: on an idle completer goroutine when
// one waits, else on a new one.
func (p *pending) run(f *flight) {
	select {
	case p.work <- f:
	default:
		go p.completer(f)
	}
}

// completerIdle is how long a completer goroutine waits for the next
// Complete before it exits.
const completerIdle = 100 * time.Millisecond

// completer runs background Completes, the first f, then each that run
// hands it, until none came for completerIdle or Close has stopped
// waiting. A Complete goes deep (the store's client, a pipeline): a
// goroutine started for each would grow its stack each time, which cost
// more CPU than the Complete's own code; a completer keeps the stack it
// grew.
func (p *pending) completer(f *flight) {
	var idle *time.Timer
	for {
		f.complete()
		if idle == nil {
			idle = time.NewTimer(completerIdle)
		} else {
			idle.Reset(completerIdle)
		}
		select {
		case f = <-p.work:
		case <-idle.C:
			return
		case <-p.stop.Done():
			idle.Stop()
			return
		}
	}
}

// complete records f's message done (it was acked already) and ends the
// flight. A failure can only be reported: the cycle logs it.
func (f *flight) complete() {
	defer f.m.async.done(f)
	// Acked already: what the record became can only be reported, and
	// Finish has logged and counted it.
	_, _ = f.m.cyc.Finish(&f.ctx, f.msg, f.hb, f.data, nil)
}

func newPending(linger time.Duration) *pending {
	p := &pending{idle: make(chan struct{}), keys: map[flightKey]*flight{}, work: make(chan *flight)}
	p.linger = stores.WithLinger(context.Background(), linger)
	p.stop, p.cancel = context.WithCancel(context.Background())
	return p
}

// flightKey is one record a flight completes; a struct, so that a lookup
// builds no string.
type flightKey struct{ scope, key string }

// start registers a background Complete of c by the middleware m, for msg
// whose handler ran under hb and produced data, or returns nil after
// Close: the caller then completes synchronously. run sends it.
func (p *pending) start(m *Middleware, c *stores.Claim, msg *message.Message, hb *cycle.Beat, data []byte) *flight {
	f := &flight{scope: c.Scope, keys: c.Keys, m: m, msg: msg, hb: hb, data: data}
	f.ctx = completeCtx{values: hb.Detached(), stop: p.stop, linger: p.linger}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.n++
	for _, k := range c.Keys {
		p.keys[flightKey{c.Scope, k}] = f
	}
	return f
}

// done ends f: its keys are no longer in flight.
func (p *pending) done(f *flight) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range f.keys {
		if fk := (flightKey{f.scope, k}); p.keys[fk] == f {
			delete(p.keys, fk)
		}
	}
	if f.done != nil {
		close(f.done)
	}
	p.landings.Add(1)
	p.n--
	if p.n == 0 && p.closed {
		close(p.idle)
	}
}

// landing returns a channel closed when this middleware's background
// Complete of any of keys has ended, or nil when none is in flight.
func (p *pending) landing(scope string, keys []string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		if f, ok := p.keys[flightKey{scope, k}]; ok {
			if f.done == nil {
				// Not ended: done deletes its keys, under p.mu.
				f.done = make(chan struct{})
			}
			return f.done
		}
	}
	return nil
}

func (p *pending) close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		if p.n == 0 {
			close(p.idle)
		}
	}
	p.mu.Unlock()
	select { // nothing in flight: nothing to give up on, whatever ctx says
	case <-p.idle:
		p.cancel()
		return nil
	default:
	}
	select {
	case <-p.idle:
		p.cancel()
		return nil
	case <-ctx.Done():
		p.cancel()
		<-p.idle
		return ctx.Err()
	}
}

// handleAsync is ModeAsyncComplete's flow: ModeLease's, but the handler's
// message is acked once the handler succeeds, and its record completed in
// the background; a duplicate finding its keys in progress first waits for
// a Complete of this middleware's own still on its way.
func (m *Middleware) handleAsync(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	landings := m.async.landings.Load()
	own := func(c *stores.Claim) (*stores.Claim, error) {
		return m.awaitOwnComplete(msg, scope, keys, c, landings)
	}
	c, out, err, done := m.claim(h, msg, scope, keys, own)
	if done {
		return out, err
	}
	outputs, data, hb, err := m.cyc.Run(msg, c, h)
	if err != nil {
		return nil, err
	}
	// A store that never blocks has no round trip to hide, and after
	// Close nothing runs in the background: complete before the ack.
	if m.cyc.NonBlocking() {
		return m.cyc.Finish(hb.Detached(), msg, hb, data, outputs)
	}
	f := m.async.start(m, c, msg, hb, data)
	if f == nil {
		return m.cyc.Finish(hb.Detached(), msg, hb, data, outputs)
	}
	// Its context is the message's as the handler got it (hb's parent),
	// detached from its cancellation: the message itself belongs to the
	// router again, which may set another.
	m.async.run(f)
	return outputs, nil
}

// awaitOwnComplete handles keys found in progress under
// ModeAsyncComplete: when the run holding them is this middleware's own,
// acked already with its Complete on the way, the duplicate waits for that
// Complete (as ModeLease would have made the first delivery's ack wait for
// it), up to Tuning.CompleteTimeout, and claims again. Nacking it instead
// would cost the broker's redelivery delay. Keys another consumer holds
// stay in progress.
//
// landings is the count of ended background Completes before the claim
// that found the keys in progress: when it moved, one of ours may have
// landed between the store reading the record and the lookup here, and
// the keys are claimed once more.
func (m *Middleware) awaitOwnComplete(msg *message.Message, scope string, keys []string, c *stores.Claim, landings uint64) (*stores.Claim, error) {
	var deadline <-chan time.Time
	for tries := 0; c.Result == stores.InProgress; tries++ {
		landed := m.async.landing(scope, keys)
		if landed == nil {
			if tries > 0 || m.async.landings.Load() == landings {
				return c, nil
			}
			landed = closedChan
		}
		if deadline == nil {
			t := time.NewTimer(m.cyc.Policy().Tuning.CompleteTimeout)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-landed:
		case <-deadline:
			return c, nil
		case <-msg.Context().Done():
			return c, nil
		}
		again, err := m.cyc.Claim(msg.Context(), scope, keys)
		if err != nil {
			return nil, err
		}
		c = again
	}
	return c, nil
}

// closedChan is a channel that is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
