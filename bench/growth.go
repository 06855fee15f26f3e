package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
)

// benchStore is a store under measurement.
type benchStore struct {
	name  string
	store stores.Store
	// mem returns the bytes the backend uses now (Go heap, Redis
	// used_memory, table size), to derive bytes per record.
	mem     func(ctx context.Context) (int64, error)
	cleanup func()
}

// storeOpeners are the stores the growth section measures, each opened
// fresh; an opener returns an error naming an unreachable service.
func storeOpeners() []func(ctx context.Context) (*benchStore, error) {
	return []func(ctx context.Context) (*benchStore, error){
		openMemstore,
		openRedisBench,
		openPostgresBench,
	}
}

func openMemstore(ctx context.Context) (*benchStore, error) {
	o, cleanup, err := anystore.OpenStore(ctx, anystore.StoreParams{Kind: anystore.StoreMemory})
	if err != nil {
		return nil, err
	}
	return &benchStore{
		name:  "memstore",
		store: o.Store,
		mem: func(context.Context) (int64, error) {
			runtime.GC()
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return int64(m.HeapAlloc), nil
		},
		cleanup: func() { _ = cleanup(context.Background()) },
	}, nil
}

// runGrowth fills each store with 10^3, 10^5 and 10^6 live done records
// (36-byte keys, one scope) and measures the latency of claiming a new key
// at each level; at 10^6 it also reports the bytes per record.
func runGrowth(ctx context.Context, o *options) ([]result, error) {
	const sec = "growth"
	levels := []int{1_000, 100_000, 1_000_000}
	if o.quick {
		levels = []int{1_000, 10_000, 50_000}
	}
	var rs []result
	for _, open := range storeOpeners() {
		bs, err := open(ctx)
		if err != nil {
			rs = append(rs, skipped(sec, err.Error())...)
			continue
		}
		r, err := measureGrowth(ctx, bs, levels, o)
		bs.cleanup()
		if err != nil {
			return rs, fmt.Errorf("%s: %w", bs.name, err)
		}
		rs = append(rs, r...)
	}
	return rs, nil
}

func measureGrowth(ctx context.Context, bs *benchStore, levels []int, o *options) ([]result, error) {
	const scope = "loyalty" // a handler name
	retention := 2 * time.Hour
	memBefore, err := bs.mem(ctx)
	if err != nil {
		return nil, err
	}
	var rs []result
	var p50s []time.Duration
	filled := 0
	for _, level := range levels {
		if err := fill(ctx, bs.store, scope, filled, level, retention); err != nil {
			return rs, err
		}
		filled = level
		if level == levels[len(levels)-1] {
			memAfter, err := bs.mem(ctx)
			if err != nil {
				return rs, err
			}
			rs = append(rs, result{"memory", "memory_" + bs.name + "_bytes_per_record", float64(memAfter-memBefore) / float64(level), "bytes", fmt.Sprintf("%d done records, 36-byte keys; goal <= 110 (memstore 120)", level)})
		}
		samples := o.scale(2000, 4)
		lat := make([]time.Duration, 0, samples)
		for i := range samples {
			key := benchKey(1<<40 + level*10 + i)
			start := time.Now()
			c, err := bs.store.Claim(ctx, scope, []string{key}, time.Minute)
			lat = append(lat, time.Since(start))
			if err != nil {
				return rs, err
			}
			if err := bs.store.Release(ctx, c); err != nil {
				return rs, err
			}
		}
		p50, p99 := percentiles(lat)
		p50s = append(p50s, p50)
		rs = append(rs,
			result{"growth", fmt.Sprintf("growth_%s_claim_p50_us_at_%d", bs.name, level), micros(p50), "µs", ""},
			result{"growth", fmt.Sprintf("growth_%s_claim_p99_us_at_%d", bs.name, level), micros(p99), "µs", ""},
		)
	}
	rs = append(rs, result{"growth", "growth_" + bs.name + "_p50_ratio_largest_vs_smallest", float64(p50s[len(p50s)-1]) / float64(p50s[0]), "x", "goal <= 1.3"})
	return rs, nil
}

// benchKey is a 36-byte, UUID-shaped key.
func benchKey(i int) string {
	return fmt.Sprintf("%08x-5f2a-4c0d-9a51-%012x", i&0xffffffff, i)
}

// fill claims and completes keys [from, to) with 32 workers.
func fill(ctx context.Context, s stores.Store, scope string, from, to int, retention time.Duration) error {
	const workers = 32
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	next := make(chan int, 1024)
	go func() {
		defer close(next)
		for i := from; i < to; i++ {
			next <- i
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := s.Claim(ctx, scope, []string{benchKey(i)}, time.Minute)
				if err == nil {
					err = s.Complete(ctx, c, retention, nil)
				}
				if err != nil {
					mu.Lock()
					ferr = err
					mu.Unlock()
					for range next { // drain so the feeder stops
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	return ferr
}
