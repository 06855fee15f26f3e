package batch_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/internal/testkit/base"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// gatedExec is an Exec that answers req+1 for every call, after waiting
// for a gate when the batch holds a call with a gated request.
type gatedExec struct {
	mu      sync.Mutex
	gates   map[int]chan struct{} // request -> gate its batch waits on
	batches [][]int
	ctxs    []context.Context
	entered chan int // the first request of every batch, as it starts
}

func newGatedExec(gated ...int) *gatedExec {
	g := &gatedExec{gates: map[int]chan struct{}{}, entered: make(chan int, 100)}
	for _, r := range gated {
		g.gates[r] = make(chan struct{})
	}
	return g
}

func (g *gatedExec) exec(ctx context.Context, calls []*batch.Call[int, int]) error {
	reqs := make([]int, len(calls))
	for i, c := range calls {
		reqs[i] = c.Req
	}
	g.mu.Lock()
	g.batches = append(g.batches, reqs)
	g.ctxs = append(g.ctxs, ctx)
	g.mu.Unlock()
	g.entered <- reqs[0]
	for _, r := range reqs {
		if gate, ok := g.gates[r]; ok {
			<-gate
		}
	}
	for _, c := range calls {
		c.Set(c.Req+1, nil)
	}
	return nil
}

func (g *gatedExec) open(req int) { close(g.gates[req]) }

func (g *gatedExec) ran(req int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, b := range g.batches {
		for _, r := range b {
			if r == req {
				return true
			}
		}
	}
	return false
}

type outcome struct {
	resp int
	err  error
	at   time.Time
}

// goDo runs b.Do in a goroutine and returns where its outcome arrives.
func goDo(b *batch.Batcher[int, int], ctx context.Context, req int) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, err := b.Do(ctx, req)
		ch <- outcome{r, err, time.Now()}
	}()
	return ch
}

// stuckFirst returns a gatedExec with gates for the requests gated, a
// Batcher over it with MaxBatch 8 and maxInFlight, and where the outcome
// of call 1 arrives, sent to it: it returns once call 1's batch has
// started (gate 1, when gated, holds it).
func stuckFirst(maxInFlight int, gated ...int) (*gatedExec, *batch.Batcher[int, int], <-chan outcome) {
	g := newGatedExec(gated...)
	b := batch.New(g.exec, 8, maxInFlight)
	first := goDo(b, context.Background(), 1)
	<-g.entered
	return g, b, first
}

// last returns the requests of the latest batch.
func (g *gatedExec) last() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.batches[len(g.batches)-1]
}

func TestDoneContextNeverRuns(t *testing.T) {
	g := newGatedExec()
	b := batch.New(g.exec, 8, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Do(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if g.ran(1) {
		t.Fatal("a call whose context was done reached Exec")
	}
}

// A queued call whose deadline passes leaves the queue at once, while the
// batch ahead of it is still stuck, and never reaches Exec.
func TestQueuedCallLeavesAtItsDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	g, b, first := stuckFirst(1, 1) // batch [1] holds the only slot

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// It returns while batch [1] still holds the slot (gate 1 is shut),
	// however long after its deadline the machine lets it run.
	var o outcome
	select {
	case o = <-goDo(b, ctx, 2):
	case <-time.After(time.Minute):
		g.open(1)
		t.Fatal("the queued call did not leave at its deadline while the batch ahead of it was stuck")
	}
	if !errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", o.err)
	}
	if n := b.Queued(); n != 0 {
		t.Fatalf("%d calls still queued after the caller left", n)
	}
	g.open(1)
	if o := <-first; o.err != nil || o.resp != 2 {
		t.Fatalf("first call = %d, %v", o.resp, o.err)
	}
	if g.ran(2) {
		t.Fatal("the call that left the queue reached Exec")
	}
}

// A call whose deadline passes while its batch runs returns at once; the
// batch carries on for the others, and the dropped result goes to the
// OnOrphaned undo, which Close waits for.
func TestRunningCallLeavesAtItsDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGatedExec(1, 2)
	b := batch.New(g.exec, 8, 1)
	orphans := make(chan []int, 1)
	b.OnOrphaned(time.Second, func(ctx context.Context, calls []*batch.Call[int, int]) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the undo's context has no deadline")
		}
		var got []int
		for _, c := range calls {
			r, err := c.Result()
			if err != nil {
				t.Errorf("orphan %d has error %v", c.Req, err)
			}
			got = append(got, r)
		}
		orphans <- got
	})
	first := goDo(b, context.Background(), 1)
	<-g.entered

	long := goDo(b, context.Background(), 2)
	queued(t, b, 1)
	// The short call's deadline passes once its batch runs, when the test
	// says so (see base.DeadlineCtx), not after a timer that a slow machine
	// could let run out while the call still queued.
	ctx := base.NewDeadlineCtx()
	defer ctx.Expire()
	short := goDo(b, ctx, 3)
	queued(t, b, 2)

	g.open(1) // batch [2 3] starts, and waits on gate 2
	<-first
	if r := <-g.entered; r != 2 {
		t.Fatalf("batch led by %d, want 2", r)
	}
	ctx.Expire()
	// It returns while its batch still waits on gate 2.
	o := <-short
	if !errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("short call = %d, %v; want context.DeadlineExceeded", o.resp, o.err)
	}
	g.open(2)
	if o := <-long; o.err != nil || o.resp != 3 {
		t.Fatalf("long call = %d, %v; a caller leaving must not fail the batch", o.resp, o.err)
	}
	select {
	case got := <-orphans:
		if len(got) != 1 || got[0] != 4 {
			t.Fatalf("orphans = %v, want the short call's result [4]", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the orphaned result never reached the OnOrphaned undo")
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A batch of several calls runs under the latest of their deadlines, and
// is not cancelled when its leader's caller gives up.
func TestBatchContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	g, b, first := stuckFirst(1, 1, 2)

	ctxLead, cancelLead := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLead()
	lead := goDo(b, ctxLead, 2)
	queued(t, b, 1)
	ctxOther, cancelOther := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancelOther()
	other := goDo(b, ctxOther, 3)
	queued(t, b, 2)

	g.open(1)
	<-first
	<-g.entered // batch [2 3]
	g.mu.Lock()
	bctx := g.ctxs[len(g.ctxs)-1]
	g.mu.Unlock()
	want, _ := ctxOther.Deadline()
	if got, ok := bctx.Deadline(); !ok || !got.Equal(want) {
		t.Fatalf("batch deadline = %v, %v; want the latest caller's, %v", got, ok, want)
	}
	cancelLead()
	if o := <-lead; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled leader = %d, %v; want context.Canceled", o.resp, o.err)
	}
	if err := bctx.Err(); err != nil {
		t.Fatalf("the batch context ended with its leader's: %v", err)
	}
	g.open(2)
	if o := <-other; o.err != nil || o.resp != 4 {
		t.Fatalf("other call = %d, %v", o.resp, o.err)
	}
}

// A call is not held back by a batch that is stuck, as long as a slot is
// free: it goes out at once, in a batch of its own.
func TestLoneCallNotHeldBackByABusySlot(t *testing.T) {
	g, b, first := stuckFirst(2, 1)
	if r, err := b.Do(context.Background(), 5); err != nil || r != 6 {
		t.Fatalf("Do(5) = %d, %v", r, err)
	}
	last := g.last()
	if len(last) != 1 || last[0] != 5 {
		t.Fatalf("lone call ran in batch %v, want [5]", last)
	}
	g.open(1)
	<-first
}

// Many callers with random deadlines against a slow Exec: every call
// returns, by its deadline or with its own result, and nothing leaks.
func TestDeadlineStress(t *testing.T) {
	defer goleak.VerifyNone(t)
	var orphaned atomic.Int64
	b := batch.New(func(ctx context.Context, calls []*batch.Call[int, int]) error {
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		for _, c := range calls {
			c.Set(c.Req+1, nil)
		}
		return nil
	}, 16, 2)
	b.OnOrphaned(time.Second, func(_ context.Context, calls []*batch.Call[int, int]) { orphaned.Add(int64(len(calls))) })
	var timedOut atomic.Int64
	together(64, func(g int) {
		for i := range 200 {
			req := g*1000 + i
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(400))*time.Microsecond)
			r, err := b.Do(ctx, req)
			cancel()
			switch {
			case err == nil && r != req+1:
				t.Errorf("Do(%d) = %d", req, r)
			case err != nil && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("Do(%d): %v", req, err)
			case err != nil:
				timedOut.Add(1)
			}
		}
	})
	if b.Queued() != 0 {
		t.Fatalf("%d calls left queued", b.Queued())
	}
	// Every slot is free again: a lone call runs at once.
	if r, err := b.Do(context.Background(), 1); err != nil || r != 2 {
		t.Fatalf("Do after the storm = %d, %v", r, err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls timed out, %d results orphaned", timedOut.Load(), orphaned.Load())
}

// endingCtx is a context whose end the test controls in two steps: end
// makes Err report context.Canceled, and leave closes Done. Between the two
// it holds open the window, short in real use, between a caller's context
// ending and that caller taking its call back out of the queue.
type endingCtx struct {
	context.Context
	ended atomic.Bool
	done  chan struct{}
}

func newEndingCtx() *endingCtx {
	return &endingCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *endingCtx) end()                  { c.ended.Store(true) }
func (c *endingCtx) leave()                { close(c.done) }
func (c *endingCtx) Done() <-chan struct{} { return c.done }

func (c *endingCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// A batch skips the calls whose context is done by the time it starts,
// wherever they stand in the batch: they get their context's error, and
// Exec sees only the others.
func TestBatchSkipsCallsWhoseContextEnded(t *testing.T) {
	defer goleak.VerifyNone(t)
	g, b, first := stuckFirst(1, 1) // batch [1] holds the only slot

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ending := newEndingCtx()
	defer ending.leave()
	dead := goDo(b, ending, 2)
	queued(t, b, 1)
	live := goDo(b, ctx, 3)
	queued(t, b, 2)
	ending.end()

	g.open(1) // the batch of calls 2 and 3 starts
	if o := <-first; o.err != nil || o.resp != 2 {
		t.Fatalf("first call = %d, %v", o.resp, o.err)
	}
	if o := <-dead; !errors.Is(o.err, context.Canceled) || o.resp != 0 {
		t.Fatalf("call whose context ended = %d, %v; want context.Canceled", o.resp, o.err)
	}
	if o := <-live; o.err != nil || o.resp != 4 {
		t.Fatalf("live call = %d, %v", o.resp, o.err)
	}
	if g.ran(2) {
		t.Fatal("a call whose context had ended reached Exec")
	}
	last := g.last()
	if len(last) != 1 || last[0] != 3 {
		t.Fatalf("last batch = %v, want [3]", last)
	}
}

// Close waits for the undos running, and drops the orphans of batches
// that end after it.
func TestCloseWaitsForUndos(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGatedExec(10, 11, 20, 21)
	b := batch.New(g.exec, 8, 1)
	undoing, finish := make(chan struct{}), make(chan struct{})
	var undone atomic.Int64
	b.OnOrphaned(time.Minute, func(_ context.Context, calls []*batch.Call[int, int]) {
		if undone.Add(int64(len(calls))) == 1 {
			close(undoing)
			<-finish
		}
	})
	// orphan runs call req+1 in a batch behind one of req, and leaves it
	// while it runs; it returns once that batch has ended.
	orphan := func(req int) {
		first := goDo(b, context.Background(), req)
		<-g.entered
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		left := goDo(b, ctx, req+1)
		queued(t, b, 1)
		g.open(req)
		<-first
		<-g.entered
		cancel()
		if o := <-left; !errors.Is(o.err, context.Canceled) {
			t.Fatalf("call that left = %d, %v", o.resp, o.err)
		}
		g.open(req + 1)
		// The next call runs once the orphan's batch has ended.
		if _, err := b.Do(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		<-g.entered
	}
	orphan(10)
	<-undoing

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with an undo running = %v, want it to wait until ctx ends", err)
	}
	orphan(20) // dropped: Close has begun
	close(finish)
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := undone.Load(); n != 1 {
		t.Fatalf("%d orphans undone, want 1 (none after Close)", n)
	}
}

// A call that finds a slot free while another batch is out, and that
// nobody joins, runs in its caller's goroutine, as a lone call: no worker
// goroutine to start, and no wake-up between the batch and its caller.
func TestFreeSlotCallRunsInCaller(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGatedExec(1)
	var inCaller atomic.Bool
	b := batch.New(func(ctx context.Context, calls []*batch.Call[int, int]) error {
		if calls[0].Req == 5 {
			buf := make([]byte, 64<<10)
			inCaller.Store(strings.Contains(string(buf[:runtime.Stack(buf, false)]), "batch_test.TestFreeSlotCallRunsInCaller("))
		}
		return g.exec(ctx, calls)
	}, 8, 2)
	first := goDo(b, context.Background(), 1)
	<-g.entered
	if r, err := b.Do(context.Background(), 5); err != nil || r != 6 {
		t.Fatalf("Do(5) = %d, %v", r, err)
	}
	if !inCaller.Load() {
		t.Fatal("the call ran in a goroutine other than its caller's")
	}
	g.open(1)
	<-first
}
