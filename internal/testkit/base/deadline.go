package base

import (
	"context"
	"sync"
	"time"
)

// DeadlineCtx is a context whose deadline passes when the test calls
// Expire, not when a clock says so: a test of what a call does when its
// deadline passes at a given point (queued, or out in a pipeline) gets
// there by events, however slow the machine. Deadline reports an hour
// from its making, for the code that reads it (a batch runs under the
// latest deadline of its calls).
type DeadlineCtx struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

// NewDeadlineCtx returns a DeadlineCtx whose deadline has not passed.
func NewDeadlineCtx() *DeadlineCtx {
	return &DeadlineCtx{Context: context.Background(), at: time.Now().Add(time.Hour), done: make(chan struct{})}
}

// Deadline reports an hour from the context's making.
func (c *DeadlineCtx) Deadline() (time.Time, bool) { return c.at, true }

// Done is closed by Expire.
func (c *DeadlineCtx) Done() <-chan struct{} { return c.done }

// Err is context.DeadlineExceeded once Expire was called, else nil.
func (c *DeadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Expire makes the deadline pass now.
func (c *DeadlineCtx) Expire() { c.once.Do(func() { close(c.done) }) }
