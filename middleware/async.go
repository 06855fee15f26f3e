package middleware

import (
	"context"
	"sync"
)

// pending counts the Completes running in the background under
// AsyncComplete, so that Close can wait for them.
type pending struct {
	// stop ends the retries of the Completes still running when Close
	// gives up waiting.
	stop   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed once n is 0 after Close
}

func newPending() *pending {
	p := &pending{idle: make(chan struct{})}
	p.stop, p.cancel = context.WithCancel(context.Background())
	return p
}

// start counts one more Complete, or reports false after Close: the
// caller then completes synchronously.
func (p *pending) start() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.n++
	return true
}

func (p *pending) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	if p.n == 0 && p.closed {
		close(p.idle)
	}
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
