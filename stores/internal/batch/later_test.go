package batch_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// recorder is an Exec that records each batch's requests and answers each
// call with its request; a batch waits for gate while it is set.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	at      map[int]time.Time // when each request went out
	gate    chan struct{}
}

func newRecorder() *recorder { return &recorder{at: map[int]time.Time{}} }

func (r *recorder) exec(_ context.Context, calls []*batch.Call[int, int]) error {
	r.mu.Lock()
	var reqs []int
	for _, c := range calls {
		reqs = append(reqs, c.Req)
		r.at[c.Req] = time.Now()
	}
	r.batches = append(r.batches, reqs)
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	for _, c := range calls {
		c.Set(c.Req, nil)
	}
	return nil
}

// gated returns a recorder whose batches wait until release.
func gated() *recorder {
	r := newRecorder()
	r.gate = make(chan struct{})
	return r
}

// release lets the batches waiting at the gate, and those after, go on.
func (r *recorder) release() {
	r.mu.Lock()
	close(r.gate)
	r.gate = nil
	r.mu.Unlock()
}

// slowFirst sends req with Do in the background under ctx, waits until
// its batch is out (held at r's gate), and returns its result's channel.
func slowFirst(t *testing.T, ctx context.Context, r *recorder, b *batch.Batcher[int, int], req int) <-chan error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { _, err := b.Do(ctx, req); ch <- err }()
	testkit.WaitFor(t, 10*time.Second, "the first call out", func() bool { return len(r.sent()) == 1 })
	return ch
}

func (r *recorder) sent() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

// later runs DoLater in a goroutine and returns its result's channel.
func later(ctx context.Context, b *batch.Batcher[int, int], req int, linger time.Duration) <-chan error {
	ch := make(chan error, 1)
	go func() {
		got, err := b.DoLater(ctx, req, linger)
		if err == nil && got != req {
			err = errors.New("wrong result")
		}
		ch <- err
	}()
	return ch
}

// queuedLater sends req with later and waits until n calls are queued.
func queuedLater(t *testing.T, ctx context.Context, b *batch.Batcher[int, int], req int, linger time.Duration, n int) <-chan error {
	t.Helper()
	ch := later(ctx, b, req, linger)
	queued(t, b, n)
	return ch
}

// A call sent with DoLater while nothing is out waits for the next call
// and goes out in its batch, ahead of it: one round trip for both.
func TestLaterGoesOutWithTheNextCall(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 64, 2, 10*time.Second)
	done := queuedLater(t, ctx, b, 1, time.Hour, 1)
	if got := r.sent(); len(got) != 0 {
		t.Fatalf("the later call went out alone: %v", got)
	}
	if got, err := b.Do(ctx, 2); err != nil || got != 2 {
		t.Fatalf("Do = %d, %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("DoLater: %v", err)
	}
	if got := r.sent(); !slices.EqualFunc(got, [][]int{{1, 2}}, slices.Equal) {
		t.Fatalf("batches %v, want [[1 2]]", got)
	}
}

// A call sent with DoLater while a batch is out does not go out alone
// when that batch ends: it waits for the next call.
func TestLaterWaitsForACallNotForABatchEnding(t *testing.T) {
	r := gated()
	b, ctx := batcher(t, r, 64, 2, 10*time.Second)
	first := slowFirst(t, ctx, r, b, 1)
	done := queuedLater(t, ctx, b, 2, time.Hour, 1)
	r.release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The slot is free again, and the later call still waits.
	if got := r.sent(); len(got) != 1 || b.Queued() != 1 {
		t.Fatalf("batches %v, %d queued: the later call went out on its own", got, b.Queued())
	}
	if _, err := b.Do(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := r.sent(); !slices.EqualFunc(got, [][]int{{1}, {2, 3}}, slices.Equal) {
		t.Fatalf("batches %v, want [[1] [2 3]]", got)
	}
}

// With no call to carry it, a later call goes out on its own after its
// linger, never before.
func TestLaterGoesOutAloneAfterItsLinger(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 64, 2, 10*time.Second)
	const linger = 50 * time.Millisecond
	start := time.Now()
	if err := <-later(ctx, b, 1, linger); err != nil {
		t.Fatal(err)
	}
	if got := r.sent(); !slices.EqualFunc(got, [][]int{{1}}, slices.Equal) {
		t.Fatalf("batches %v, want [[1]]", got)
	}
	if d := r.at[1].Sub(start); d < linger {
		t.Fatalf("it went out after %s, before its linger of %s", d, linger)
	}
}

// The timer armed for a later call that has gone out since (carried by a
// call) does not send the next later call before that one's own linger.
func TestLaterTimerOfACarriedCallDoesNotSendTheNext(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 64, 2, 10*time.Second)
	first := queuedLater(t, ctx, b, 1, 100*time.Millisecond, 1)
	if _, err := b.Do(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The timer armed for 1 fires at 100ms; it must not send 3, whose
	// linger is longer.
	const linger = 400 * time.Millisecond
	start := time.Now()
	if err := <-later(ctx, b, 3, linger); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	at := r.at[3]
	r.mu.Unlock()
	if d := at.Sub(start); d < linger {
		t.Fatalf("3 went out after %s, before its linger of %s", d, linger)
	}
}

// A later call whose context ends while it waits leaves at once, and the
// batcher's accounting is intact: the next call runs at once, alone.
func TestLaterLeavesAtItsContext(t *testing.T) {
	r := newRecorder()
	b := batch.New(r.exec, 64, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := queuedLater(t, ctx, b, 1, time.Hour, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("DoLater = %v, want context.Canceled", err)
	}
	if b.Queued() != 0 {
		t.Fatalf("%d calls left queued", b.Queued())
	}
	for i := range 3 {
		if _, err := b.Do(context.Background(), 10+i); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.sent(); !slices.EqualFunc(got, [][]int{{10}, {11}, {12}}, slices.Equal) {
		t.Fatalf("batches %v, want each call alone", got)
	}
}

// More later calls than a batch holds all go out, with the call that
// takes them along and after it.
func TestLaterMoreThanABatch(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 4, 1, 10*time.Second)
	var dones []<-chan error
	for i := range 10 {
		dones = append(dones, queuedLater(t, ctx, b, i, time.Hour, i+1))
	}
	// The carrier's batches take the queue up to and including it.
	if _, err := b.Do(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for i, d := range dones {
		select {
		case err := <-d:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("later call %d never went out (batches %v)", i, r.sent())
		}
	}
	if got := r.sent(); !slices.EqualFunc(got, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 100}}, slices.Equal) {
		t.Fatalf("batches %v, want [[0 1 2 3] [4 5 6 7] [8 9 100]]", got)
	}
}

// Do and DoLater mixed from many goroutines, with contexts that end at
// random, under the race detector: every call returns (later calls by
// their linger at the latest), with its own result or its context's
// error, and nothing is left queued.
func TestLaterStress(t *testing.T) {
	b := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
		if rand.IntN(4) == 0 {
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		}
		for _, c := range calls {
			c.Set(c.Req, nil)
		}
		return nil
	}, 8, 2)
	together(16, func(g int) {
		for i := range 300 {
			req := g*1000 + i
			ctx, cancel := context.WithCancel(context.Background())
			if rand.IntN(10) == 0 {
				time.AfterFunc(time.Duration(rand.IntN(300))*time.Microsecond, cancel)
			}
			var got int
			var err error
			if g%2 == 0 {
				got, err = b.DoLater(ctx, req, time.Duration(rand.IntN(2000))*time.Microsecond)
			} else {
				got, err = b.Do(ctx, req)
			}
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("call %d: %v", req, err)
			}
			if err == nil && got != req {
				t.Errorf("call %d got %d", req, got)
			}
		}
	})
	if n := b.Queued(); n != 0 {
		t.Fatalf("%d calls left queued", n)
	}
	// The accounting is intact: a lone call runs at once, alone.
	if _, err := b.Do(context.Background(), -1); err != nil {
		t.Fatal(err)
	}
}

// A later call goes out by its due time even while a slow batch is out:
// in a free slot, not after that batch.
func TestLaterGoesOutInAFreeSlotWhenDue(t *testing.T) {
	r := gated()
	b, bg := batcher(t, r, 64, 4, 30*time.Second)
	first := slowFirst(t, bg, r, b, 1)
	done := later(bg, b, 2, time.Millisecond)
	testkit.WaitFor(t, 10*time.Second, "the later call out beside the slow one", func() bool { return len(r.sent()) == 2 })
	r.release()
	for _, ch := range []<-chan error{first, done} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}

// With every slot busy, a due later call goes out in the next batch to
// start, even without a call sent with Do.
func TestLaterDueGoesOutWhenASlotFrees(t *testing.T) {
	r := gated()
	b, ctx := batcher(t, r, 64, 1, 30*time.Second)
	first := slowFirst(t, ctx, r, b, 1)
	start := time.Now()
	done := queuedLater(t, ctx, b, 2, time.Millisecond, 1)
	// Due: past its linger while the only slot is busy.
	for time.Since(start) < 5*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	r.release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the due later call: %v (batches %v)", err, r.sent())
	}
}

// A short linger is not held up by the timer armed for a longer one
// queued before it.
func TestLaterShortLingerBehindALongOne(t *testing.T) {
	r := newRecorder()
	b := batch.New(r.exec, 64, 2)
	bg, cancelBg := context.WithCancel(context.Background())
	long := queuedLater(t, bg, b, 1, time.Hour, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.DoLater(ctx, 2, time.Millisecond); err != nil {
		t.Fatalf("DoLater(1ms) behind DoLater(1h): %v; batches %v", err, r.sent())
	}
	// It took the long one along.
	if err := <-long; err != nil {
		t.Fatal(err)
	}
	cancelBg()
}

// Later calls alone, more than a batch holds, all go out.
func TestLaterOnlyMoreThanABatch(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 3, 1, 10*time.Second)
	var dones []<-chan error
	for i := range 10 {
		dones = append(dones, later(ctx, b, i, time.Millisecond))
	}
	for i, d := range dones {
		if err := <-d; err != nil {
			t.Fatalf("%d: %v (batches %v)", i, err, r.sent())
		}
	}
	n := 0
	for _, s := range r.sent() {
		n += len(s)
		if len(s) > 3 {
			t.Fatalf("a batch of %d: %v", len(s), r.sent())
		}
	}
	if n != 10 {
		t.Fatalf("%d calls sent, want 10: %v", n, r.sent())
	}
}

// wentOut fails the test, with b's state, unless the later call whose
// result arrives on done went out without error.
func wentOut(t *testing.T, r *recorder, b *batch.Batcher[int, int], done <-chan error, what string) {
	t.Helper()
	if err := <-done; err != nil {
		inF, eager, _, armed := b.State()
		t.Fatalf("%s: %v; queued=%d inFlight=%d eager=%d timerArmed=%v batches=%v",
			what, err, b.Queued(), inF, eager, armed, r.sent())
	}
}

// More DoLater calls than MaxBatch, no Do: the timer sends the first
// MaxBatch; the rest, not yet due when that batch ends, stay queued with
// the timer armed for them (they were left with none, and never sent).
func TestLaterLeftByATimerFlushIsSent(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 1, 2, 10*time.Second)
	a := queuedLater(t, ctx, b, 1, 150*time.Millisecond, 1)
	bl := later(ctx, b, 2, 800*time.Millisecond) // due at +800ms, queued behind 1
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	// 2's context ends at 10s: a call left with no timer fails with it.
	wentOut(t, r, b, bl, "2 (linger 800ms)")
}

// The timer fires while every slot is busy (flushLater returns); the due
// call then leaves (its context ends); the batch out ends and next() frees
// the slot: the other DoLater call, not yet due, is sent at its due time
// (it was left with no timer, and never sent).
func TestLaterLeftAfterABusyFlushIsSent(t *testing.T) {
	r := gated()
	b, ctx := batcher(t, r, 64, 1, 10*time.Second)
	first := slowFirst(t, ctx, r, b, 1)
	xctx, xcancel := context.WithCancel(ctx)
	x := queuedLater(t, xctx, b, 2, time.Millisecond, 1)
	y := queuedLater(t, ctx, b, 3, 700*time.Millisecond, 2)
	// Event: the timer for 2 has fired and returned (every slot busy).
	testkit.WaitFor(t, 5*time.Second, "timer fired with every slot busy", func() bool {
		_, _, _, armed := b.State()
		return !armed
	})
	xcancel()
	<-x
	r.release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// 3's context ends at 10s: a call left with no timer fails with it.
	wentOut(t, r, b, y, "3 (linger 700ms)")
}

// MaxInFlight is never exceeded with the timer path and carriers
// mixed, and the counters return to zero.
func TestLaterMixedKeepsMaxInFlightAndCounters(t *testing.T) {
	const maxIF = 2
	var out, peak atomic.Int32
	b := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
		n := out.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(50 * time.Microsecond)
		for _, c := range calls {
			c.Set(c.Req, nil)
		}
		out.Add(-1)
		return nil
	}, 4, maxIF)
	together(8, func(g int) {
		for i := range 200 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if (g+i)%3 == 0 {
				_, _ = b.Do(ctx, i)
			} else {
				_, _ = b.DoLater(ctx, i, time.Duration(1+i%5)*100*time.Microsecond)
			}
			cancel()
		}
	})
	if p := peak.Load(); p > maxIF {
		t.Fatalf("%d batches out at once, MaxInFlight %d", p, maxIF)
	}
	testkit.WaitFor(t, 5*time.Second, "counters at rest", func() bool {
		inF, eager, starting, _ := b.State()
		return inF == 0 && eager == 0 && !starting && b.Queued() == 0
	})
}

// Close sends the later calls at once, not after their linger (before
// the store's client is closed), and returns once they have gone out.
func TestCloseSendsLaterCalls(t *testing.T) {
	r := newRecorder()
	b, ctx := batcher(t, r, 64, 2, 10*time.Second)
	done := queuedLater(t, ctx, b, 1, time.Hour, 1)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.sent(); len(got) != 1 {
		t.Fatalf("batches sent when Close returned: %v, want [[1]]", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("the later call after Close: %v", err)
	}
}

// A burst of background Completes larger than MaxBatch (Redis's defaults,
// 128 and 2) and then no more traffic: they all go out.
func TestLaterBurstOverMaxBatch(t *testing.T) {
	t.Run("1ms", func(t *testing.T) { burst(t, time.Millisecond, 200*time.Microsecond) })
	t.Run("20ms", func(t *testing.T) { burst(t, 20*time.Millisecond, 2*time.Millisecond) })
}

func burst(t *testing.T, linger, stagger time.Duration) {
	r := newRecorder()
	b, ctx := batcher(t, r, 128, 2, 10*time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	stuck := 0
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.DoLater(ctx, i, linger); err != nil {
				mu.Lock()
				stuck++
				mu.Unlock()
			}
		}()
		if i%50 == 49 {
			time.Sleep(stagger)
		}
	}
	wg.Wait()
	if stuck > 0 {
		t.Fatalf("%d of 300 DoLater calls (linger %s) still unsent after 10s; %d batches", stuck, linger, len(r.sent()))
	}
}
