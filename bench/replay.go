package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// replayCases are the stores a replay is measured on (the naive SET NX
// as the reference), in ModeLease but for the async case.
var replayCases = []e2eCase{caseNaive, caseMemstore, caseRedis, caseAsyncRedis, casePostgres}

// runReplay measures a consumer group re-reading messages it has already
// processed (an offset reset: here a new consumer group on the same
// topic, with a new middleware on the same store and scope, as a
// restarted consumer would have), against the first pass over them: on
// kfake with 16 partitions, 10,000 messages, per store, in alternating
// rounds. Every message of the replay is a duplicate: one read of the
// store, no handler, no Complete.
func runReplay(ctx context.Context, o *options) ([]result, error) {
	const sec = "replay"
	st, cleanup, err := openE2EStores(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := o.scale(10000, 20)
	b, err := openKfake(16, n)
	if err != nil {
		return skipped(sec, err.Error()), nil
	}
	defer b.close()
	var cases []e2eCase
	var rs []result
	for _, c := range replayCases {
		if len(o.cases) > 0 && !o.cases[c.name] {
			continue
		}
		if !st.available(c) {
			rs = append(rs, skipped(sec, c.name+": its store is not reachable")...)
			continue
		}
		cases = append(cases, c)
	}
	if _, err := consumeRate(ctx, b, nil, st.handler(casePlain), nil, ""); err != nil {
		return rs, fmt.Errorf("warm-up: %w", err)
	}
	lat := &storeLatencies{}
	type pass struct{ first, replay e2eRun }
	runs := map[string][]pass{}
	rounds := o.scale(3, 3)
	for round := range rounds {
		for i := range cases {
			c := cases[(round+i)%len(cases)]
			first, replay, err := replayOnce(ctx, b, c, st, lat)
			if err != nil {
				return rs, fmt.Errorf("%s: %w", c.name, err)
			}
			runs[c.name] = append(runs[c.name], pass{first, replay})
		}
	}
	for _, c := range cases {
		pp := runs[c.name]
		f := func(g func(p pass) float64) []float64 {
			xs := make([]float64, len(pp))
			for i, p := range pp {
				xs[i] = g(p)
			}
			return xs
		}
		prefix := "replay_kfake16_" + c.name + "_"
		ratios := f(func(p pass) float64 { return p.replay.rate / p.first.rate })
		cpuRatios := f(func(p pass) float64 { return float64(p.replay.cpu) / float64(p.first.cpu) })
		rs = append(rs,
			result{sec, prefix + "first_msgs_per_s", median(f(func(p pass) float64 { return p.first.rate })), "msgs/s",
				fmt.Sprintf("%s: %d new messages, kfake 16 partitions; %s", c.note, n, spread(f(func(p pass) float64 { return p.first.rate })))},
			result{sec, prefix + "replay_msgs_per_s", median(f(func(p pass) float64 { return p.replay.rate })), "msgs/s",
				"the same messages again, a new consumer group, every one a duplicate; " + spread(f(func(p pass) float64 { return p.replay.rate }))},
			result{sec, prefix + "replay_vs_first_ratio", median(ratios), "x", "goal >= 1.0; " + spread(ratios)},
			result{sec, prefix + "first_cpu_us_per_msg", median(f(func(p pass) float64 { return micros(p.first.cpu) })), "us", "consumer process CPU a message, first pass"},
			result{sec, prefix + "replay_cpu_us_per_msg", median(f(func(p pass) float64 { return micros(p.replay.cpu) })), "us", "consumer process CPU a message, replay"},
			result{sec, prefix + "replay_vs_first_cpu_ratio", median(cpuRatios), "x", spread(cpuRatios)},
		)
		if c.store != "" {
			claims := f(func(p pass) float64 { return micros(p.first.claim) })
			again := f(func(p pass) float64 { return micros(p.replay.claim) })
			rs = append(rs,
				result{sec, prefix + "first_claim_mean_us", median(claims), "us", "mean Claim latency, first pass"},
				result{sec, prefix + "replay_claim_mean_us", median(again), "us", "mean Claim latency (a duplicate's only store call), replay"},
			)
		}
	}
	return rs, nil
}

// replayOnce publishes b.n messages to a new topic, consumes them with c
// (the first pass), then consumes them again in a new consumer group,
// with a new middleware of c on the same scope (the replay).
func replayOnce(ctx context.Context, b *e2eBroker, c e2eCase, st *e2eStores, lat *storeLatencies) (first, replay e2eRun, err error) {
	run := runID()
	topic := b.topic(run)
	scope := "replay-" + run
	pass := func(sub message.Subscriber, group string) (e2eRun, error) {
		mw, closeMW, err := st.middlewareFor(c, scope, lat)
		if err != nil {
			return e2eRun{}, err
		}
		lat.reset()
		r, err := consume(ctx, b, sub, topic, group, b.n, mw, st.handler(c), st.meter(c), "replay_"+c.name+"_"+strings.TrimPrefix(group, run+"-"))
		if cerr := closeMW(ctx); err == nil {
			err = cerr
		}
		r.claim, r.complete = lat.means()
		r.duplicates = lat.duplicates.Load()
		return r, err
	}
	// The group must exist before the messages, as in consumeRate.
	firstGroup := run + "-first"
	sub, err := b.newSub(firstGroup)
	if err != nil {
		return first, replay, err
	}
	if s, ok := sub.(message.SubscribeInitializer); ok {
		if err := s.SubscribeInitialize(topic); err != nil {
			return first, replay, err
		}
	}
	if err := publish(b, topic, run, b.n); err != nil {
		return first, replay, err
	}
	start := time.Now()
	if first, err = pass(sub, firstGroup); err != nil {
		return first, replay, fmt.Errorf("first pass: %w", err)
	}
	replayGroup := run + "-replay"
	if sub, err = b.newSub(replayGroup); err != nil {
		return first, replay, err
	}
	if replay, err = pass(sub, replayGroup); err != nil {
		return first, replay, fmt.Errorf("replay: %w", err)
	}
	if c.store != "" && replay.duplicates != int64(b.n) {
		return first, replay, fmt.Errorf("replay: %d duplicates of %d messages", replay.duplicates, b.n)
	}
	fmt.Fprintf(os.Stderr, "bench: replay %s: %.0f then %.0f msgs/s (%s)\n", c.name, first.rate, replay.rate, time.Since(start).Round(time.Millisecond))
	return first, replay, nil
}
