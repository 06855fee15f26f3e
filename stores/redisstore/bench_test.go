package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// BenchmarkRedisStore measures claim+complete cycles (what the middleware
// does for every new message: two store calls) against the shared Redis,
// from 1, 16 and 64 goroutines, with batching on (the default) and off.
//
//	go test -run '^$' -bench BenchmarkRedisStore ./stores/redisstore/
func BenchmarkRedisStore(b *testing.B) {
	addr := testkit.RequireRedis(b)
	for _, mode := range []struct {
		name  string
		batch redisstore.BatchConfig
	}{{"batched", redisstore.BatchConfig{}}, {"unbatched", redisstore.BatchConfig{Disabled: true}}} {
		for _, conc := range []int{1, 16, 64} {
			b.Run(mode.name+"/concurrency="+strconv.Itoa(conc), func(b *testing.B) {
				benchmarkCycles(b, addr, conc, redisstore.Config{Batch: mode.batch})
			})
		}
	}
}

// benchmarkCycles runs b.N claim+complete cycles of new UUID keys from
// conc goroutines on a store with cfg.
func benchmarkCycles(b *testing.B, addr string, conc int, cfg redisstore.Config) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: conc, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	s := newStore(b, c, cfg)
	storetest.RunParallel(b, conc, storetest.ClaimComplete(s, "orders"))
}

// BenchmarkMemory writes 1,000,000 done records without data (scope
// "orders", 36-byte keys, pipelined through the store's own claim and
// complete scripts) for each key layout, and reports the used_memory
// growth per record, then deletes them. It ignores b.N: run it once.
//
//	go test -run '^$' -bench BenchmarkMemory -benchtime 1x ./stores/redisstore/
//
// The shared Redis must not be busy with other writers for the figure to
// mean anything.
func BenchmarkMemory(b *testing.B) {
	if testing.Short() {
		b.Skip("writes 1,000,000 records")
	}
	const n = 1_000_000
	addr := testkit.RequireRedis(b)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 8, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	b.Cleanup(func() { _ = c.Close() })

	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
		key  func(i int) string
	}{
		// Watermill message ids: canonical UUIDs, packed into 16 bytes.
		{"uuid", redisstore.Config{}, func(i int) string { return watermill.NewUUID() }},
		// Other 36-byte keys, verbatim.
		{"raw36", redisstore.Config{}, func(i int) string { return fmt.Sprintf("payment-%028d", i) }},
		// Other 36-byte keys, stored as 128-bit digests.
		{"digest36", redisstore.Config{DigestKeysLongerThan: 16}, func(i int) string { return fmt.Sprintf("payment-%028d", i) }},
		// Watermill message ids with CompactKeys.
		{"compact", redisstore.Config{CompactKeys: true}, func(i int) string { return watermill.NewUUID() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// A unique prefix as long as the default ("dedup:", or "d:"
			// with CompactKeys), so the figure is the default layout's and
			// cleanup touches only ours.
			tc.cfg.Prefix = "b" + storetest.NewID()[:4] + ":"
			if tc.cfg.CompactKeys {
				tc.cfg.Prefix = "~" + storetest.NewID()[:1]
			}
			b.Cleanup(func() { deletePrefix(b, c, tc.cfg.Prefix) })
			s := newStore(b, c, tc.cfg)
			ctx := context.Background()
			keys := make([]string, n)
			for i := range keys {
				keys[i] = tc.key(i)
			}

			before := settledUsedMemory(b, c)
			b.ResetTimer()
			const batch = 2000
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			var next atomic.Int64
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						lo := int(next.Add(batch)) - batch
						if lo >= n {
							return
						}
						if err := s.WriteDone(ctx, "orders", keys[lo:min(lo+batch, n)], time.Hour); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			after := settledUsedMemory(b, c)
			b.ReportMetric(float64(after-before)/n, "bytes/record")
			b.ReportMetric(float64(len(s.EncodeKey("orders", keys[0]))), "key-bytes")
		})
	}
}

// settledUsedMemory returns INFO memory's used_memory once two readings
// half a second apart agree to within 0.1%: an incremental rehash of the
// keyspace after a large write holds both tables until it finishes.
func settledUsedMemory(b *testing.B, c *redis.Client) int64 {
	b.Helper()
	read := func() int64 {
		info, err := c.Info(context.Background(), "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
		}
		b.Fatal("no used_memory in INFO memory")
		return 0
	}
	prev := read()
	for range 40 {
		time.Sleep(500 * time.Millisecond)
		cur := read()
		if d := cur - prev; d < 0 && -d < prev/1000 || d >= 0 && d < prev/1000 {
			return cur
		}
		prev = cur
	}
	return prev
}
