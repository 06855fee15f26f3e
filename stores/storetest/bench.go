package storetest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// RunParallel calls op b.N times, each with a fresh key, from workers
// goroutines, and reports messages per second ("msgs/s"). Store
// benchmarks use it so that every store is measured the same way.
func RunParallel(b *testing.B, workers int, op func(ctx context.Context, key string) error) {
	prefix := "k-" + NewID() + "-"
	ctx := context.Background()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, workers)
	)
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(ctx, prefix+strconv.FormatInt(i, 10)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// ClaimComplete is the middleware's work for a new message in lease mode,
// for RunParallel: claim the key in scope, then complete it.
func ClaimComplete(s stores.Store, scope string) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		c, err := s.Claim(ctx, scope, []string{key}, time.Minute)
		if err != nil {
			return err
		}
		if c.Result != stores.Claimed {
			return fmt.Errorf("claim of a new key: %s", c.Result)
		}
		return s.Complete(ctx, c, time.Hour, nil)
	}
}
