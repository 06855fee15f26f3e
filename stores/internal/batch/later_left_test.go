package batch_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

func sentReq(r *recorder, req int) bool {
	for _, b := range r.sent() {
		if slices.Contains(b, req) {
			return true
		}
	}
	return false
}

// More DoLater calls than MaxBatch, no Do: the timer sends the first
// MaxBatch; the rest, not yet due when that batch ends, stay queued with
// the timer armed for them (they were left with none, and never sent).
func TestLaterLeftByATimerFlushIsSent(t *testing.T) {
	r := newRecorder()
	b := batch.New(r.exec, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := later(ctx, b, 1, 150*time.Millisecond)
	queued(t, b, 1)
	bl := later(ctx, b, 2, 800*time.Millisecond) // due at +800ms, queued behind 1
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	// 2's context ends at 10s: a call left with no timer fails with it.
	if err := <-bl; err != nil {
		inF, eager, _, armed := b.State()
		t.Fatalf("2 (linger 800ms): %v; queued=%d inFlight=%d eager=%d timerArmed=%v batches=%v",
			err, b.Queued(), inF, eager, armed, r.sent())
	}
}

// The timer fires while every slot is busy (flushLater returns); the due
// call then leaves (its context ends); the batch out ends and next() frees
// the slot: the other DoLater call, not yet due, is sent at its due time
// (it was left with no timer, and never sent).
func TestLaterLeftAfterABusyFlushIsSent(t *testing.T) {
	r := gated()
	b := batch.New(r.exec, 64, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := slowFirst(t, ctx, r, b, 1)
	xctx, xcancel := context.WithCancel(ctx)
	x := later(xctx, b, 2, time.Millisecond)
	queued(t, b, 1)
	y := later(ctx, b, 3, 700*time.Millisecond)
	queued(t, b, 2)
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
	if err := <-y; err != nil {
		inF, eager, _, armed := b.State()
		t.Fatalf("3 (linger 700ms): %v; queued=%d inFlight=%d eager=%d timerArmed=%v batches=%v",
			err, b.Queued(), inF, eager, armed, r.sent())
	}
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
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if (g+i)%3 == 0 {
					_, _ = b.Do(ctx, i)
				} else {
					_, _ = b.DoLater(ctx, i, time.Duration(1+i%5)*100*time.Microsecond)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > maxIF {
		t.Fatalf("%d batches out at once, MaxInFlight %d", p, maxIF)
	}
	testkit.WaitFor(t, 5*time.Second, "counters at rest", func() bool {
		inF, eager, starting, _ := b.State()
		return inF == 0 && eager == 0 && !starting && b.Queued() == 0
	})
}

// Close sends the lingering calls, and returns once they have gone out.
func TestCloseReturnsAfterTheLaterCallsWentOut(t *testing.T) {
	r := newRecorder()
	b := batch.New(r.exec, 64, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := later(ctx, b, 1, time.Hour)
	queued(t, b, 1)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.sent(); len(got) != 1 {
		t.Fatalf("batches sent when Close returned: %v, want [[1]]", got)
	}
	if err := <-d; err != nil {
		t.Fatal(err)
	}
}
