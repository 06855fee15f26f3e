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
}

// flight is one background Complete.
type flight struct {
	scope string
	keys  []string
	done  chan struct{} // closed when the Complete has landed or given up
}

func newPending() *pending {
	p := &pending{idle: make(chan struct{}), keys: map[flightKey]*flight{}}
	p.stop, p.cancel = context.WithCancel(context.Background())
	return p
}

// flightKey is one record a flight completes; a struct, so that a lookup
// builds no string.
type flightKey struct{ scope, key string }

// start registers a background Complete of c, or returns nil after Close:
// the caller then completes synchronously.
func (p *pending) start(c *stores.Claim) *flight {
	f := &flight{scope: c.Scope, keys: c.Keys, done: make(chan struct{})}
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
	close(f.done)
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

// startAsync registers a background Complete of c, or returns nil when c
// completes before the ack: outside ModeAsyncComplete, on a store that
// never blocks, and after Close.
func (m *Middleware) startAsync(c *stores.Claim) *flight {
	if m.async == nil || m.cyc.NonBlocking() {
		return nil
	}
	return m.async.start(c)
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

// completeAsync records a message already acked (ModeAsyncComplete): the
// subscriber may have cancelled its context, so the Complete detaches
// from it, and a failure can only be reported (the cycle logs it).
//
// msgCtx is the message's context as the handler got it: the message
// itself belongs to the router again, which may set another.
func (m *Middleware) completeAsync(msgCtx context.Context, msg *message.Message, hb *cycle.Beat, data []byte) {
	// Detached from the message, whose subscriber may cancel it after the
	// ack, but stopped by a Close that gives up waiting.
	ctx, cancel := context.WithCancel(context.WithoutCancel(msgCtx))
	defer cancel()
	defer context.AfterFunc(m.async.stop, cancel)()
	m.cyc.Complete(ctx, msg, hb, data)
}
