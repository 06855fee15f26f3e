package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

func runID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func redisUsedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory")
}

func openRedisBench(ctx context.Context) (*benchStore, error) {
	o, cleanup, err := anystore.OpenStore(ctx, anystore.StoreParams{
		Kind: anystore.StoreRedis,
		// As long as the default prefix ("dedup:"), so bytes per record
		// are those of the default layout; unique, so the cleanup deletes
		// only ours.
		Name:     "b" + runID()[:4] + ":",
		PoolSize: 64,
		Teardown: true,
		Redis:    redisstore.Config{SkipServerCheck: true},
	})
	if err != nil {
		return nil, err
	}
	return &benchStore{
		name:    "redis",
		store:   o.Store,
		mem:     func(ctx context.Context) (int64, error) { return redisUsedMemory(ctx, o.Redis) },
		cleanup: func() { _ = cleanup(context.Background()) },
	}, nil
}

// rate runs op with workers goroutines for d and returns calls per
// second; op gets its worker number and a per-worker sequence number.
func rate(workers int, d time.Duration, op func(w, i int) error) (float64, error) {
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		ferr atomic.Value
		stop atomic.Bool
	)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if err := op(w, i); err != nil {
					ferr.Store(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	if err, _ := ferr.Load().(error); err != nil {
		return 0, err
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// throughput runs claim+complete cycles of new keys on s with c workers
// for d and returns messages per second.
func throughput(ctx context.Context, s stores.Store, workers int, d time.Duration, keyPrefix string) (float64, error) {
	return rate(workers, d, func(w, i int) error {
		c, err := s.Claim(ctx, "bench", []string{keyPrefix + strconv.Itoa(w) + "-" + strconv.Itoa(i)}, time.Minute)
		if err != nil {
			return err
		}
		return s.Complete(ctx, c, time.Hour, nil)
	})
}

var rpsRe = regexp.MustCompile(`([0-9.]+) requests per second`)

// redisBenchmark runs redis-benchmark's unpipelined SET NX PX with c
// clients and returns its requests per second.
func redisBenchmark(ctx context.Context, clients, requests int) (float64, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark is not installed")
	}
	host, port, _ := strings.Cut(testkit.RedisAddr(), ":")
	prefix := "dedupbench:rb:" + runID() + ":"
	cmd := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-q", "-c", strconv.Itoa(clients),
		"-n", strconv.Itoa(requests), "-r", "100000000", "SET", prefix+"__rand_int__", "v", "NX", "PX", "60000")
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w", err)
	}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(bytes.ReplaceAll(out, []byte("\r"), []byte("\n"))))
	for sc.Scan() {
		if m := rpsRe.FindStringSubmatch(sc.Text()); m != nil {
			last = m[1]
		}
	}
	if last == "" {
		return 0, fmt.Errorf("redis-benchmark printed no rate: %q", out)
	}
	c := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
	_ = redisclean.DeletePrefix(ctx, c, prefix)
	_ = c.Close()
	return strconv.ParseFloat(last, 64)
}

// runRedis compares redisstore's claim+complete rate at 1, 16 and 64
// concurrent handlers with redis-benchmark's SET NX PX at the same client
// counts.
func runRedis(ctx context.Context, o *options) ([]result, error) {
	const sec = "redis"
	bs, err := openRedisBench(ctx)
	if err != nil {
		return skipped(sec, err.Error()), nil
	}
	defer bs.cleanup()
	d, rounds := 3*time.Second, 3
	if o.quick {
		d, rounds = time.Second, 1
	}
	var rs []result
	for _, c := range []int{1, 16, 64} {
		// Side by side, rounds times: the medians drift less with the
		// machine's load than figures taken once, minutes apart.
		var stores, rbs, ratios []float64
		for r := range rounds {
			mps, err := throughput(ctx, bs.store, c, d, fmt.Sprintf("k%d-%d-", c, r))
			if err != nil {
				return rs, err
			}
			stores = append(stores, mps)
			rb, err := redisBenchmark(ctx, c, o.scale(max(20000, c*3000), 4))
			if err != nil {
				rs = append(rs, skipped(sec, err.Error())...)
				break
			}
			rbs, ratios = append(rbs, rb), append(ratios, mps/rb)
		}
		note := fmt.Sprintf("median of %d rounds", len(stores))
		rs = append(rs, result{sec, fmt.Sprintf("redis_store_c%d_msgs_per_s", c), median(stores), "msgs/s", "claim+complete, " + note})
		if len(ratios) == 0 {
			continue
		}
		rs = append(rs,
			result{sec, fmt.Sprintf("redis_benchmark_setnx_c%d_ops_per_s", c), median(rbs), "ops/s", "redis-benchmark SET NX PX, unpipelined, " + note},
			result{sec, fmt.Sprintf("redis_store_vs_setnx_c%d_ratio", c), median(ratios), "x", goalNote(c == 64, "goal >= 1.0; ") + "median of the rounds' ratios"},
		)
	}
	return rs, nil
}

func goalNote(when bool, note string) string {
	if when {
		return note
	}
	return ""
}
