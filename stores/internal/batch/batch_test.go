package batch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

func TestLoneCallRunsAtOnceAlone(t *testing.T) {
	var sizes []int
	b := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
		sizes = append(sizes, len(calls))
		for _, c := range calls {
			c.Set(c.Req*2, nil)
		}
		return nil
	}, 64, 1)
	// Bounded, so that a slot never freed fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		got, err := b.Do(ctx, i)
		if err != nil || got != 2*i {
			t.Fatalf("Do(%d) = %d, %v", i, got, err)
		}
	}
	for _, n := range sizes {
		if n != 1 {
			t.Fatalf("sequential calls were batched: sizes %v", sizes)
		}
	}
}

func TestConcurrentCallsCoalesce(t *testing.T) {
	const callers = 200
	var (
		mu      sync.Mutex
		batches int
		maxSize int
		running atomic.Int32
		maxRun  atomic.Int32
	)
	b := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
		n := running.Add(1)
		if n > maxRun.Load() {
			maxRun.Store(n)
		}
		time.Sleep(2 * time.Millisecond) // a round trip
		mu.Lock()
		batches++
		maxSize = max(maxSize, len(calls))
		mu.Unlock()
		for _, c := range calls {
			if c.Req%10 == 0 {
				c.Set(0, errors.New("odd one out"))
				continue
			}
			c.Set(c.Req+1, nil)
		}
		running.Add(-1)
		return nil
	}, 32, 2)
	// Bounded, so that a queued call nobody runs fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := b.Do(ctx, i)
			if i%10 == 0 {
				if err == nil {
					t.Errorf("call %d: want its own error", i)
				}
				return
			}
			if err != nil || got != i+1 {
				t.Errorf("call %d = %d, %v", i, got, err)
			}
		}()
	}
	wg.Wait()
	if batches >= callers/2 || maxSize < 2 || maxSize > 32 {
		t.Fatalf("%d batches for %d concurrent calls, largest %d: want coalescing, at most 32 a batch", batches, callers, maxSize)
	}
	if maxRun.Load() > 2 {
		t.Fatalf("%d batches ran at once, want at most 2", maxRun.Load())
	}
}

func TestExecErrorReachesUnsetCalls(t *testing.T) {
	boom := errors.New("backend down")
	b := batch.New(func(context.Context, []*batch.Call[int, int]) error { return boom }, 8, 1)
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	b2 := batch.New(func(context.Context, []*batch.Call[int, int]) error { return nil }, 8, 1)
	if _, err := b2.Do(context.Background(), 1); err == nil {
		t.Fatal("a call Exec forgot must fail, not return a zero result")
	}
}

// BenchmarkLoneCall measures what the batcher adds to a call that finds
// nothing else out (it runs inline): compare with BenchmarkDirectCall.
func BenchmarkLoneCall(b *testing.B) {
	bt := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
		for _, c := range calls {
			c.Set(c.Req, nil)
		}
		return nil
	}, 128, 4)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := bt.Do(ctx, i); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirectCall is the baseline of BenchmarkLoneCall.
func BenchmarkDirectCall(b *testing.B) {
	exec := func(_ context.Context, req int) (int, error) { return req, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := exec(ctx, i); err != nil {
			b.Fatal(err)
		}
	}
}
