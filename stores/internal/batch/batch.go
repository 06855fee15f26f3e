package batch

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Exec runs one batch. It must set a result (or error) for every call,
// through Call.Set, before returning; calls it leaves unset fail with the
// returned error, or with errUnset when it returned nil. ctx is the
// batch's context (see the package documentation); each call's own
// context is [Call.Context].
type Exec[Req, Resp any] func(ctx context.Context, calls []*Call[Req, Resp]) error

// Call states. A call is pending until its result is delivered to its
// caller or its caller gives up, whichever comes first.
const (
	pending int32 = iota
	delivered
	abandoned
)

// Call is one caller's request and, after Exec, its result.
type Call[Req, Resp any] struct {
	Req  Req
	ctx  context.Context
	resp Resp
	err  error
	set  bool

	state atomic.Int32
	// done receives one value once the result is set. It is buffered, so
	// the batch never blocks on a caller that has left.
	done chan struct{}
	// self is the batch of a call run alone.
	self [1]*Call[Req, Resp]
	// later marks a call sent with DoLater, which waits for a carrier
	// until due.
	later bool
	due   time.Time
}

// Set records the call's result.
func (c *Call[Req, Resp]) Set(resp Resp, err error) {
	c.resp, c.err, c.set = resp, err, true
}

// Context returns the context the call was made with.
func (c *Call[Req, Resp]) Context() context.Context { return c.ctx }

// Result returns what Set recorded.
func (c *Call[Req, Resp]) Result() (Resp, error) { return c.resp, c.err }

// Batcher coalesces calls to one Exec. The zero value is not usable; use
// New.
type Batcher[Req, Resp any] struct {
	exec        Exec[Req, Resp]
	maxBatch    int
	maxInFlight int

	// undo, with its timeout, undoes the results of orphaned calls; the
	// undos running are counted in undos, whose Add undoMu orders against
	// Close.
	undo        func(ctx context.Context, calls []*Call[Req, Resp])
	undoTimeout time.Duration
	undoMu      sync.Mutex
	closed      bool
	undos       sync.WaitGroup

	mu       sync.Mutex
	queue    []*Call[Req, Resp]
	inFlight int  // slots taken: lone calls running, and workers
	starting bool // a worker has taken a slot and will take the queue
	// eager counts the queued calls sent with Do: the queue goes out
	// when one of them does. Calls sent with DoLater (the others) wait
	// for one, or until the earliest of their due times, when timer
	// (armed for timerAt; zero when it is not) sends them.
	eager   int
	timer   *time.Timer
	timerAt time.Time
	// drained, made by Close, is closed once no DoLater call is queued
	// and no batch is out.
	drained chan struct{}

	// calls recycles the calls whose results were delivered. A call whose
	// caller gave up is never recycled: its batch may still hold it.
	calls sync.Pool
}

// New returns a Batcher running at most maxInFlight batches of at most
// maxBatch calls at once (both at least 1).
func New[Req, Resp any](exec Exec[Req, Resp], maxBatch, maxInFlight int) *Batcher[Req, Resp] {
	return &Batcher[Req, Resp]{exec: exec, maxBatch: max(maxBatch, 1), maxInFlight: max(maxInFlight, 1)}
}

// OnOrphaned sets undo to receive, after each batch, the calls of that
// batch whose callers gave up before their result was delivered (their
// contexts ended): a claim made for nobody is undone there, so that a
// redelivery need not wait for its lease. undo runs in a goroutine of its
// own, under a context that ends after timeout and carries no values, so
// that it holds up no batch; Close waits for it. Orphans of a batch that
// ends after Close are dropped (a claim's lease then runs out). Call it
// before the first Do.
func (b *Batcher[Req, Resp]) OnOrphaned(timeout time.Duration, undo func(ctx context.Context, calls []*Call[Req, Resp])) {
	b.undo, b.undoTimeout = undo, timeout
}

// Close makes later orphans be dropped, sends the calls DoLater queued
// without waiting for their linger, and waits until they and every batch
// out have ended and the undos already running (see OnOrphaned) have
// returned, or ctx ends (ctx's error). It does not stop Do: the store in
// front stops taking calls. It is idempotent.
func (b *Batcher[Req, Resp]) Close(ctx context.Context) error {
	b.undoMu.Lock()
	b.closed = true
	b.undoMu.Unlock()
	// The calls DoLater queued are due now, and Close waits until they
	// have gone out (the backend's client is closed after it), not for
	// their linger.
	b.mu.Lock()
	for _, c := range b.queue {
		c.due = time.Time{}
	}
	b.linger()
	if b.drained == nil {
		b.drained = make(chan struct{})
	}
	drained := b.drained
	b.checkDrained()
	b.mu.Unlock()
	select {
	case <-drained:
	case <-ctx.Done():
		return ctx.Err()
	}
	done := make(chan struct{})
	go func() {
		b.undos.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// orphaned starts the undo of orphans, unless the Batcher is closed.
func (b *Batcher[Req, Resp]) orphaned(orphans []*Call[Req, Resp]) {
	b.undoMu.Lock()
	defer b.undoMu.Unlock()
	if b.closed {
		return
	}
	b.undos.Add(1)
	go func() {
		defer b.undos.Done()
		ctx, cancel := context.WithTimeout(context.Background(), b.undoTimeout)
		defer cancel()
		b.undo(ctx, orphans)
	}()
}

type unsetError struct{}

func (unsetError) Error() string { return "batch: Exec set no result for the call" }

// Do runs req in a batch and returns its result, or ctx's error as soon as
// ctx is done (see the package documentation).
func (b *Batcher[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	if err := ctx.Err(); err != nil {
		return *new(Resp), err
	}
	c := b.newCall(ctx, req)
	b.mu.Lock()
	if b.inFlight == 0 && len(b.queue) > 0 {
		// Nothing is out, but calls sent with DoLater wait for a carrier:
		// they go out with this one.
		b.queue = append(b.queue, c)
		b.eager++
		b.inFlight++
		calls := b.take()
		b.mu.Unlock()
		if !latest(c, calls) {
			// Through a worker, as a batch of several does, so that
			// this caller can leave at its own deadline.
			go b.work(calls)
			return b.wait(ctx, c)
		}
		// The batch ends by this caller's deadline anyway: run it here,
		// without a goroutine to start and wake this caller.
		b.runHere(calls)
		return b.wait(ctx, c)
	}
	if b.inFlight == 0 {
		// Nothing else is out, so nothing is queued: run at once, alone,
		// in this goroutine and under this call's own context.
		b.inFlight++
		b.mu.Unlock()
		b.runHere(c.self[:])
		<-c.done
		return b.result(c)
	}
	b.queue = append(b.queue, c)
	b.eager++
	if b.inFlight < b.maxInFlight && !b.starting {
		// Other calls are out but a slot is free: this caller takes it,
		// and sends what is queued once the goroutines that are runnable
		// now (callers just woken by a finished batch) have queued
		// theirs.
		b.inFlight++
		b.starting = true
		b.mu.Unlock()
		if calls := b.start(); len(calls) == 1 && calls[0] == c {
			// Nobody joined: run it alone in this goroutine, as a lone
			// call, without a worker to start and wake this caller.
			b.runHere(c.self[:])
			<-c.done
			return b.result(c)
		} else if calls != nil {
			// A batch of several (or without this call, which a batch
			// finishing meanwhile took): a worker runs it, so that each
			// of its callers can leave at its own deadline.
			go b.work(calls)
		}
	} else {
		b.mu.Unlock()
	}
	return b.wait(ctx, c)
}

// DoLater is Do for a call that need not go out at once: a write nobody
// waits for on a message's path. It is queued, without taking a slot, and
// goes out with the next call sent with Do: in that call's batch, or in
// the next batch after it. If none comes within linger, it goes out
// then, with whatever else waits, in a free slot, or (every slot busy) in
// the next batch to start. Its context is honoured as in Do while it
// waits. A linger of zero or less makes it Do.
func (b *Batcher[Req, Resp]) DoLater(ctx context.Context, req Req, linger time.Duration) (Resp, error) {
	if linger <= 0 {
		return b.Do(ctx, req)
	}
	if err := ctx.Err(); err != nil {
		return *new(Resp), err
	}
	c := b.newCall(ctx, req)
	c.later, c.due = true, time.Now().Add(linger)
	b.mu.Lock()
	b.queue = append(b.queue, c)
	b.linger()
	b.mu.Unlock()
	return b.wait(ctx, c)
}

// Queued returns how many calls wait in the queue (calls sent with
// DoLater among them), for tests and diagnostics.
func (b *Batcher[Req, Resp]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// earliestDue returns the earliest due time of the queued DoLater calls,
// under mu; ok is false when none is queued.
func (b *Batcher[Req, Resp]) earliestDue() (due time.Time, ok bool) {
	for _, c := range b.queue {
		if c.later && (!ok || c.due.Before(due)) {
			due, ok = c.due, true
		}
	}
	return due, ok
}

// linger arms the timer for the earliest due time of the queued DoLater
// calls, under mu, unless it is armed for that time or sooner.
func (b *Batcher[Req, Resp]) linger() {
	due, ok := b.earliestDue()
	if !ok || (!b.timerAt.IsZero() && !b.timerAt.After(due)) {
		return
	}
	b.timerAt = due
	d := max(time.Until(due), 0)
	if b.timer == nil {
		b.timer = time.AfterFunc(d, b.flushLater)
	} else {
		b.timer.Reset(d)
	}
}

// flushLater is the linger timer. Once a DoLater call is due, it sends the
// queue in a free slot; with every slot busy (or one starting), the next
// batch to start takes it (see next). Before that (it was armed for calls
// that have gone out since), it arms itself again.
func (b *Batcher[Req, Resp]) flushLater() {
	b.mu.Lock()
	b.timerAt = time.Time{}
	due, ok := b.earliestDue()
	switch {
	case !ok:
		b.mu.Unlock()
		return
	case time.Now().Before(due):
		b.linger()
		b.mu.Unlock()
		return
	case b.starting || b.inFlight >= b.maxInFlight:
		b.mu.Unlock()
		return
	}
	b.inFlight++
	calls := b.take()
	b.mu.Unlock()
	b.work(calls)
}

// wait waits for c's result, or until ctx is done (see the package
// documentation).
func (b *Batcher[Req, Resp]) wait(ctx context.Context, c *Call[Req, Resp]) (Resp, error) {
	select {
	case <-c.done:
		return b.result(c)
	case <-ctx.Done():
		if c.state.CompareAndSwap(pending, abandoned) {
			b.mu.Lock()
			for i, q := range b.queue {
				if q == c {
					b.queue = append(b.queue[:i], b.queue[i+1:]...)
					if !c.later {
						b.eager--
					}
					break
				}
			}
			b.checkDrained()
			b.mu.Unlock()
			// If c was not queued any more, it is in a running batch,
			// which drops its result (see OnOrphaned).
			return *new(Resp), ctx.Err()
		}
		// The result was delivered just now.
		<-c.done
		return b.result(c)
	}
}

// newCall returns a pending call, recycled if one is free.
func (b *Batcher[Req, Resp]) newCall(ctx context.Context, req Req) *Call[Req, Resp] {
	c, _ := b.calls.Get().(*Call[Req, Resp])
	if c == nil {
		c = &Call[Req, Resp]{done: make(chan struct{}, 1)}
		c.self[0] = c
	}
	c.Req, c.ctx = req, ctx
	return c
}

// result returns the result of c, which has been delivered (so the batch
// that ran it no longer touches it), and recycles c.
func (b *Batcher[Req, Resp]) result(c *Call[Req, Resp]) (Resp, error) {
	resp, err := c.resp, c.err
	var zero Call[Req, Resp]
	c.Req, c.ctx, c.resp, c.err, c.set = zero.Req, nil, zero.resp, nil, false
	c.later, c.due = false, time.Time{}
	c.state.Store(pending)
	b.calls.Put(c)
	return resp, err
}

// next takes the next batch from the queue for the slot of a batch that
// has finished, or frees the slot and returns nil when no call sent with
// Do is queued and no call sent with DoLater is due (those wait for a
// call, or their due time, see linger).
func (b *Batcher[Req, Resp]) next() []*Call[Req, Resp] {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.eager == 0 {
		if due, ok := b.earliestDue(); !ok || time.Now().Before(due) {
			b.inFlight--
			// Calls DoLater queued that are not due yet (left by a batch
			// that took MaxBatch, or by a timer that found every slot
			// busy) wait for their timer.
			b.linger()
			b.checkDrained()
			return nil
		}
	}
	return b.take()
}

// checkDrained closes drained, under mu, once no DoLater call is queued
// and no batch is out.
func (b *Batcher[Req, Resp]) checkDrained() {
	if b.drained == nil || b.inFlight > 0 {
		return
	}
	if _, ok := b.earliestDue(); ok {
		return
	}
	close(b.drained)
	b.drained = nil
}

// take takes the next batch from the queue, which is not empty, under mu.
func (b *Batcher[Req, Resp]) take() []*Call[Req, Resp] {
	n := min(len(b.queue), b.maxBatch)
	calls := make([]*Call[Req, Resp], n)
	copy(calls, b.queue)
	for _, c := range calls {
		if !c.later {
			b.eager--
		}
	}
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return calls
}

// start takes the queue for a slot taken for it, after a yield: nil when
// it is empty (a batch finishing meanwhile took it; the slot is free
// again).
func (b *Batcher[Req, Resp]) start() []*Call[Req, Resp] {
	runtime.Gosched()
	b.mu.Lock()
	b.starting = false
	b.mu.Unlock()
	return b.next()
}

// runHere runs calls in the caller's goroutine, in the slot it took;
// calls queued up meanwhile go to a worker, which takes over the slot, so
// that the caller can return.
func (b *Batcher[Req, Resp]) runHere(calls []*Call[Req, Resp]) {
	b.run(calls)
	if next := b.next(); next != nil {
		go b.work(next)
	}
}

// work runs batches from the queue in a slot until the queue is empty.
// The callers wait for their results and can leave at their deadlines:
// nobody waits for a worker. After a batch of several calls it yields
// once, so that the callers it woke can queue their next calls in time to
// join the next batch.
func (b *Batcher[Req, Resp]) work(calls []*Call[Req, Resp]) {
	for ; calls != nil; calls = b.next() {
		b.run(calls)
		if len(calls) > 1 {
			runtime.Gosched()
		}
	}
}

// run runs calls as one batch and delivers the results.
func (b *Batcher[Req, Resp]) run(calls []*Call[Req, Resp]) {
	live := calls
	for i, c := range calls {
		if c.ctx.Err() == nil {
			continue
		}
		// Some callers have given up: run the others only.
		live = append(make([]*Call[Req, Resp], 0, len(calls)), calls[:i]...)
		for _, c := range calls[i:] {
			if err := c.ctx.Err(); err != nil {
				c.Set(*new(Resp), err)
			} else {
				live = append(live, c)
			}
		}
		break
	}
	if len(live) > 0 {
		ctx, cancel := batchContext(live)
		err := b.exec(ctx, live)
		cancel()
		for _, c := range live {
			if !c.set {
				if err == nil {
					err = unsetError{}
				}
				c.Set(*new(Resp), err)
			}
		}
	}

	var orphans []*Call[Req, Resp]
	for _, c := range calls {
		if c.state.CompareAndSwap(pending, delivered) {
			c.done <- struct{}{}
		} else {
			orphans = append(orphans, c)
		}
	}
	if len(orphans) > 0 && b.undo != nil {
		b.orphaned(orphans)
	}
}

// latest reports whether c is one of calls and has a deadline no other
// call's is later than, or missing: the batch's context then has c's
// deadline (see batchContext).
func latest[Req, Resp any](c *Call[Req, Resp], calls []*Call[Req, Resp]) bool {
	d, ok := c.ctx.Deadline()
	if !ok {
		return false
	}
	in := false
	for _, o := range calls {
		od, ok := o.ctx.Deadline()
		if !ok || od.After(d) {
			return false
		}
		in = in || o == c
	}
	return in
}

// batchContext returns the context a batch of live calls runs under (see
// the package documentation).
func batchContext[Req, Resp any](calls []*Call[Req, Resp]) (context.Context, context.CancelFunc) {
	if len(calls) == 1 {
		return calls[0].ctx, func() {}
	}
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(calls[0].ctx), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), latest)
}
