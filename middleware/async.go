package middleware

import (
	"context"
	"sync"
	"sync/atomic"

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
