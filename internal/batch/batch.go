// Package batch coalesces concurrent calls into batches (group commit)
// without adding latency to a lone caller.
//
// A call that arrives while fewer than MaxInFlight batches are running
// runs at once, taking every call queued so far with it. A call that
// arrives while MaxInFlight batches are running waits; when a batch
// finishes, the first waiting call leads the next batch with everything
// queued behind it (up to MaxBatch). There is no timer: a lone caller runs
// immediately, and under load the batch size grows by itself to match the
// backend's round-trip time. This is the group commit of databases, and
// the way a pipeline reaches a store's pipelined rate.
package batch

import (
	"context"
	"sync"
)

// Exec runs one batch. It must set a result (or error) for every call,
// through Call.Set, before returning; calls it leaves unset fail with the
// returned error, or with errUnset when it returned nil.
type Exec[Req, Resp any] func(ctx context.Context, calls []*Call[Req, Resp]) error

// Call is one caller's request and, after Exec, its result.
type Call[Req, Resp any] struct {
	Req  Req
	resp Resp
	err  error
	set  bool
	// wake receives true when this call must lead batch (which it
	// heads), and false once its result is set.
	wake  chan bool
	batch []*Call[Req, Resp]
}

// Set records the call's result.
func (c *Call[Req, Resp]) Set(resp Resp, err error) {
	c.resp, c.err, c.set = resp, err, true
}

// Batcher coalesces calls to one Exec. The zero value is not usable; use
// New.
type Batcher[Req, Resp any] struct {
	exec        Exec[Req, Resp]
	maxBatch    int
	maxInFlight int

	mu       sync.Mutex
	queue    []*Call[Req, Resp]
	inFlight int
}

// New returns a Batcher running at most maxInFlight batches of at most
// maxBatch calls at once (both at least 1).
func New[Req, Resp any](exec Exec[Req, Resp], maxBatch, maxInFlight int) *Batcher[Req, Resp] {
	return &Batcher[Req, Resp]{exec: exec, maxBatch: max(maxBatch, 1), maxInFlight: max(maxInFlight, 1)}
}

type unsetError struct{}

func (unsetError) Error() string { return "batch: Exec set no result for the call" }

// Do runs req in a batch and returns its result. A batch runs under the
// context of the call that leads it; every store call of this module is
// bounded by the same StoreTimeout, so that is as good as the caller's.
func (b *Batcher[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	c := &Call[Req, Resp]{Req: req, wake: make(chan bool, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.inFlight < b.maxInFlight {
		// A slot is free, so the queue held nothing else: run at once.
		b.inFlight++
		calls := b.take()
		b.mu.Unlock()
		b.lead(ctx, calls)
	} else {
		b.mu.Unlock()
	}
	for {
		if lead := <-c.wake; !lead {
			return c.resp, c.err
		}
		// Handed a slot and the batch this call heads.
		b.lead(ctx, c.batch)
	}
}

// take removes the next batch from the head of the queue; b.mu is held.
func (b *Batcher[Req, Resp]) take() []*Call[Req, Resp] {
	n := min(len(b.queue), b.maxBatch)
	calls := make([]*Call[Req, Resp], n)
	copy(calls, b.queue)
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return calls
}

// lead runs calls as one batch in a reserved slot, then hands the slot to
// the next batch, or frees it.
func (b *Batcher[Req, Resp]) lead(ctx context.Context, calls []*Call[Req, Resp]) {
	err := b.exec(ctx, calls)
	for _, c := range calls {
		if !c.set {
			if err == nil {
				err = unsetError{}
			}
			c.Set(*new(Resp), err)
		}
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		// The next batch is taken here, under the lock, so no other
		// finishing batch can hand the same calls out twice; its head
		// call runs it.
		next := b.take()
		b.mu.Unlock()
		next[0].batch = next
		next[0].wake <- true
	} else {
		b.inFlight--
		b.mu.Unlock()
	}
	// Each channel is empty here: a call is woken once with its result,
	// and a call handed a batch is woken once for that, before.
	for _, c := range calls {
		c.wake <- false
	}
}
