package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// runRedisWait measures what redisstore's Config.WaitReplicas costs: on
// a redis-server of its own with one replica (both started here from
// redis-server, on loopback, and killed afterwards; the shared Redis has
// no replica and is not to be reconfigured), claim+complete cycles of
// new keys with WaitReplicas 1 and without it, from 1, 16 and 64
// goroutines, side by side in alternating rounds, and the latency of a
// lone caller's cycle. It reports the medians and the medians of the
// rounds' ratios: on a shared machine the ratio moves far less than
// either rate.
func runRedisWait(ctx context.Context, o *options) ([]result, error) {
	const sec = "redis-wait"
	dir, err := os.MkdirTemp("", "dedup-bench-wait-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	servers, err := redistest.LaunchRedisReplicated(dir, 1)
	if err != nil {
		return skipped(sec, err.Error()), nil
	}
	defer func() {
		for _, s := range servers {
			s.Kill()
		}
	}()
	client := redis.NewClient(&redis.Options{Addr: servers[0].Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	defer client.Close()
	open := func(wait int) (stores.Store, error) {
		return redisstore.New(client, redisstore.Config{Prefix: "bw" + strconv.Itoa(wait) + ":", WaitReplicas: wait, SkipServerCheck: true})
	}
	plain, err := open(0)
	if err != nil {
		return nil, err
	}
	defer plain.Close(ctx)
	waited, err := open(1)
	if err != nil {
		return nil, err
	}
	defer waited.Close(ctx)

	d, rounds, cycles := 3*time.Second, 3, 3000
	if o.quick {
		d, rounds, cycles = time.Second, 1, 500
	}
	var rs []result
	for _, c := range []int{1, 16, 64} {
		var without, with, ratios []float64
		for r := range rounds {
			var mps [2]float64
			// Alternate which goes first: the machine's load drifts.
			for i := range 2 {
				w := (i + r) % 2
				s := []stores.Store{plain, waited}[w]
				if mps[w], err = throughput(ctx, s, c, d, fmt.Sprintf("k%d-%d-", c, r)); err != nil {
					return rs, err
				}
			}
			without, with, ratios = append(without, mps[0]), append(with, mps[1]), append(ratios, mps[1]/mps[0])
		}
		note := fmt.Sprintf("claim+complete, private Redis with one replica, median of %d rounds", rounds)
		rs = append(rs,
			result{sec, fmt.Sprintf("redis_nowait_c%d_msgs_per_s", c), median(without), "msgs/s", note},
			result{sec, fmt.Sprintf("redis_wait1_c%d_msgs_per_s", c), median(with), "msgs/s", note + ", WaitReplicas 1"},
			result{sec, fmt.Sprintf("redis_wait1_vs_nowait_c%d_ratio", c), median(ratios), "x", "median of the rounds' ratios"},
		)
	}

	// A lone caller's claim+complete: the latency WAIT adds to a message
	// on a sequential consumer.
	var p50s [2][]float64
	var p99s [2][]float64
	for r := range rounds {
		for i := range 2 {
			w := (i + r) % 2
			s := []stores.Store{plain, waited}[w]
			lat := make([]time.Duration, 0, cycles)
			for n := range cycles {
				start := time.Now()
				c, err := s.Claim(ctx, "bench", []string{fmt.Sprintf("l%d-%d-%d", w, r, n)}, time.Minute)
				if err == nil {
					err = s.Complete(ctx, c, time.Hour, nil)
				}
				if err != nil {
					return rs, err
				}
				lat = append(lat, time.Since(start))
			}
			p50, p99 := percentiles(lat)
			p50s[w], p99s[w] = append(p50s[w], micros(p50)), append(p99s[w], micros(p99))
		}
	}
	var p50ratios []float64
	for r := range rounds {
		p50ratios = append(p50ratios, p50s[1][r]/p50s[0][r])
	}
	note := fmt.Sprintf("one caller's claim+complete, %d cycles, median of %d rounds", cycles, rounds)
	rs = append(rs,
		result{sec, "redis_nowait_cycle_p50_us", median(p50s[0]), "us", note},
		result{sec, "redis_nowait_cycle_p99_us", median(p99s[0]), "us", note},
		result{sec, "redis_wait1_cycle_p50_us", median(p50s[1]), "us", note + ", WaitReplicas 1"},
		result{sec, "redis_wait1_cycle_p99_us", median(p99s[1]), "us", note + ", WaitReplicas 1"},
		result{sec, "redis_wait1_vs_nowait_cycle_p50_ratio", median(p50ratios), "x", "median of the rounds' ratios"},
	)
	return rs, nil
}
