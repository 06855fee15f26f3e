package batch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// A burst of background Completes larger than MaxBatch (Redis's defaults,
// 128 and 2) and then no more traffic: they all go out.
func TestLaterBurstOverMaxBatch(t *testing.T) {
	t.Run("1ms", func(t *testing.T) { burst(t, time.Millisecond, 200*time.Microsecond) })
	t.Run("20ms", func(t *testing.T) { burst(t, 20*time.Millisecond, 2*time.Millisecond) })
}

func burst(t *testing.T, linger, stagger time.Duration) {
	r := newRecorder()
	b := batch.New(r.exec, 128, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
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
