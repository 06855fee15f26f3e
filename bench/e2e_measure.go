package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// runE2E measures a router on each broker without dedup and with each
// case, side by side in alternating rounds: a sequential Kafka partition
// and RabbitMQ consumer, 16 partitions and 16 consumers, and watermill-sql
// on PostgreSQL.
func runE2E(ctx context.Context, o *options) ([]result, error) {
	const sec = "e2e"
	st, cleanup, err := openE2EStores(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	var rs []result
	for _, name := range []string{"redis", "postgres"} {
		if why, ok := st.missing[name]; ok {
			rs = append(rs, skipped(sec, "the cases on "+name+": "+why)...)
		}
	}
	if st.redis != nil {
		// The floor under every Redis call: one sequential round trip.
		var pings []time.Duration
		for range o.scale(2000, 50) {
			t := time.Now()
			if err := st.redis.Redis.Ping(ctx).Err(); err != nil {
				return nil, err
			}
			pings = append(pings, time.Since(t))
		}
		rs = append(rs, result{sec, "e2e_redis_ping_mean_us", micros(mean(pings)), "us", "one go-redis PING round trip, sequential"})
	}

	rounds := o.scale(3, 3)
	n := o.scale(5000, 10)
	// RabbitMQ acks each message in a round trip of its own: fewer
	// messages, so that its runs take about as long as the others.
	nRabbit := o.scale(3000, 10)
	openers := map[string]func() (*e2eBroker, error){
		"kfake1":     func() (*e2eBroker, error) { return openKfake(1, n) },
		"kfake16":    func() (*e2eBroker, error) { return openKfake(16, n) },
		"rabbitmq1":  func() (*e2eBroker, error) { return openRabbit(1, nRabbit) },
		"rabbitmq16": func() (*e2eBroker, error) { return openRabbit(16, nRabbit) },
		"sqlpg":      func() (*e2eBroker, error) { return openSQLPubSub(ctx, o.scale(1500, 5)) },
	}
	lat := &storeLatencies{}
	for _, name := range e2eBrokerNames {
		if len(o.brokers) > 0 && !o.brokers[name] {
			continue
		}
		b, err := openers[name]()
		if err != nil {
			rs = append(rs, skipped(sec, err.Error())...)
			continue
		}
		start := time.Now()
		brs, err := measureBroker(ctx, b, st, lat, rounds, o)
		b.close()
		rs = append(rs, brs...)
		if err != nil {
			return rs, fmt.Errorf("%s: %w", b.name, err)
		}
		fmt.Fprintf(os.Stderr, "bench: e2e %s done in %s\n", b.name, time.Since(start).Round(time.Millisecond))
	}
	return rs, nil
}

// pickCases returns the cases of b to run: those whose stores are open
// and that -cases picks, and the cases they are measured against.
func pickCases(b *e2eBroker, st *e2eStores, o *options) []e2eCase {
	want := map[string]bool{casePlain.name: true}
	for _, c := range b.cases {
		if len(o.cases) == 0 || o.cases[c.name] {
			want[c.name] = true
			if c.base != "" {
				want[c.base] = true
			}
			if c.usesRedis() && !c.naive && !c.write && !c.diagnostic {
				// The dedup cases on Redis are compared with the naive
				// peer.
				want[caseNaive.name] = true
			}
		}
	}
	var cases []e2eCase
	for _, c := range b.cases {
		if want[c.name] && st.available(c) {
			cases = append(cases, c)
		}
	}
	return cases
}

// measureBroker runs every case of b, plain included, once a round, and
// reports the medians of the rates and of the rounds' ratios.
func measureBroker(ctx context.Context, b *e2eBroker, st *e2eStores, lat *storeLatencies, rounds int, o *options) ([]result, error) {
	const sec = "e2e"
	cases := pickCases(b, st, o)
	// One run unmeasured: the broker's first consumer pays for connections
	// and buffers the others find ready.
	if _, err := consumeRate(ctx, b, nil, st.handler(casePlain), nil, ""); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	runs := map[string][]e2eRun{}
	for round := range rounds {
		// Each round starts one case further on, so that no case always
		// runs on a broker just used by the same neighbour.
		for i := range cases {
			c := cases[(round+i)%len(cases)]
			r, err := runCase(ctx, b, c, st, lat)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			runs[c.name] = append(runs[c.name], r)
		}
	}
	// each applies f to the runs of a case round by round.
	each := func(rr []e2eRun, f func(r e2eRun, round int) float64) []float64 {
		xs := make([]float64, len(rr))
		for i, r := range rr {
			xs[i] = f(r, i)
		}
		return xs
	}
	rate := func(r e2eRun, _ int) float64 { return r.rate }
	// perMsg is the time a message occupies its partition or consumer.
	perMsg := func(r e2eRun) time.Duration {
		return time.Duration(float64(b.inFlight) / r.rate * float64(time.Second))
	}
	prefix := "e2e_" + b.name + "_"
	plain := runs[casePlain.name]
	rs := []result{{sec, prefix + "plain_msgs_per_s", median(each(plain, rate)), "msgs/s",
		fmt.Sprintf("%s, %d messages, router without dedup; %s", b.desc, b.n, spread(each(plain, rate)))}}
	rs = append(rs, cpuResults(prefix, casePlain, plain, each)...)
	rs = append(rs, pathResults(prefix, casePlain, plain, each)...)
	for _, c := range cases {
		if c.name == casePlain.name {
			continue
		}
		rr, base := runs[c.name], runs[c.base]
		ratios := each(rr, func(r e2eRun, i int) float64 { return r.rate / base[i].rate })
		added := each(rr, func(r e2eRun, i int) float64 { return micros(perMsg(r) - perMsg(base[i])) })
		addedCPU := each(rr, func(r e2eRun, i int) float64 { return micros(r.cpu - base[i].cpu) })
		goal := ""
		if !b.sequential() && !c.diagnostic && !c.naive {
			switch {
			case c.tx:
				goal = "goal >= 0.9; "
			case c.write:
				goal = "goal >= 0.85; "
			case c.base == casePlain.name:
				goal = "goal >= 0.9; "
			}
		}
		rs = append(rs,
			result{sec, prefix + c.name + "_msgs_per_s", median(each(rr, rate)), "msgs/s", c.note},
			result{sec, prefix + c.name + "_vs_" + c.base + "_ratio", median(ratios), "x", goal + spread(ratios)},
			result{sec, prefix + c.name + "_added_us", median(added), "us",
				"time added to a message on its partition/consumer; " + spread(added)},
		)
		rs = append(rs, cpuResults(prefix, c, rr, each)...)
		rs = append(rs, result{sec, prefix + c.name + "_added_cpu_us", median(addedCPU), "us",
			"consumer CPU a message costs over " + c.base + "; " + spread(addedCPU)})
		rs = append(rs, pathResults(prefix, c, rr, each)...)
		if c.store == "" {
			continue // no store calls
		}
		claims := each(rr, func(r e2eRun, _ int) float64 { return micros(r.claim) })
		op, done := "Claim", "Complete (after the ack with AsyncComplete)"
		if c.tx {
			op, done = "Begin", "Commit"
		}
		rs = append(rs,
			result{sec, prefix + c.name + "_claim_mean_us", median(claims), "us", "mean " + op + " latency seen by the middleware"},
			result{sec, prefix + c.name + "_complete_mean_us", median(each(rr, func(r e2eRun, _ int) float64 { return micros(r.complete) })), "us",
				"mean " + done + " latency"},
		)
		if c.store == "memory" || c.write {
			continue // no round trip to compare with, or a handler's besides
		}
		over := each(rr, func(r e2eRun, i int) float64 {
			return float64(perMsg(r)-perMsg(base[i])) / float64(r.claim)
		})
		goal = ""
		if b.sequential() {
			switch {
			case !c.async:
				goal = "Claim and Complete on the path: about 2; "
			case strings.HasPrefix(b.name, "rabbitmq"):
				goal = "goal <= 1.2; "
			default:
				goal = "goal <= 1.1; "
			}
		}
		rs = append(rs, result{sec, prefix + c.name + "_added_over_claim_ratio", median(over), "x", goal + spread(over)})
	}
	// Against the hand-rolled SET NX, round by round: the rate, and the
	// consumer CPU each adds to plain.
	if naive := runs[caseNaive.name]; len(naive) > 0 {
		for _, c := range []e2eCase{caseAsyncRedis, caseRedis, caseAsyncRedisID} {
			rr := runs[c.name]
			if len(rr) == 0 {
				continue
			}
			ratios := each(rr, func(r e2eRun, i int) float64 { return r.rate / naive[i].rate })
			goal := "goal >= 0.5; "
			switch {
			case c.diagnostic:
				goal = ""
			case c.async:
				goal = "goal >= 0.9; "
			}
			rs = append(rs, result{sec, prefix + c.name + "_vs_naive_setnx_ratio", median(ratios), "x", goal + spread(ratios)})
			cpuRatios := each(rr, func(r e2eRun, i int) float64 {
				return float64(r.cpu-plain[i].cpu) / float64(naive[i].cpu-plain[i].cpu)
			})
			rs = append(rs, result{sec, prefix + c.name + "_added_cpu_vs_naive_setnx_ratio", median(cpuRatios), "x",
				goalNote(b.name == "kfake16" && !c.diagnostic, "goal <= 2; ") + "consumer CPU added to plain, this case's / naive's; " + spread(cpuRatios)})
		}
	}
	// The transactional inbox against the handler's own transaction: the
	// record's INSERTs in a transaction that exists anyway.
	if own, tx := runs[casePlainWriteTx.name], runs[caseTxWrite.name]; len(own) > 0 && len(tx) > 0 {
		ratios := each(tx, func(r e2eRun, i int) float64 { return r.rate / own[i].rate })
		rs = append(rs, result{sec, prefix + caseTxWrite.name + "_vs_plain_write_tx_ratio", median(ratios), "x",
			"diagnostic: against the handler's INSERT in its own transaction; " + spread(ratios)})
	}
	// AsyncComplete against ModeLease on the same store, round by round.
	for _, pair := range [][2]e2eCase{{caseRedis, caseAsyncRedis}, {casePostgres, caseAsyncPostgres}} {
		lease, async := runs[pair[0].name], runs[pair[1].name]
		if len(lease) == 0 || len(async) == 0 {
			continue
		}
		ratios := each(async, func(r e2eRun, i int) float64 { return r.rate / lease[i].rate })
		rs = append(rs, result{sec, prefix + "async_vs_lease_" + pair[0].store + "_ratio", median(ratios), "x",
			goalNote(b.sequential(), "goal >= 1.0; ") + spread(ratios)})
	}
	return rs, nil
}

// cpuResults are the CPU figures of a case's runs: the consumer's (this
// process) and its servers' per message.
func cpuResults(prefix string, c e2eCase, rr []e2eRun, each func([]e2eRun, func(e2eRun, int) float64) []float64) []result {
	const sec = "e2e"
	self := each(rr, func(r e2eRun, _ int) float64 { return micros(r.cpu) })
	rs := []result{{sec, prefix + c.name + "_cpu_us_per_msg", median(self), "us",
		"consumer process CPU (user+system) a message; " + spread(self)}}
	if slices.ContainsFunc(rr, func(r e2eRun) bool { return r.hasRedis }) {
		xs := each(rr, func(r e2eRun, _ int) float64 { return micros(r.redisCPU) })
		rs = append(rs, result{sec, prefix + c.name + "_redis_cpu_us_per_msg", median(xs), "us",
			"Redis server CPU a message (INFO cpu; the shared server's, others' calls included); " + spread(xs)})
	}
	if slices.ContainsFunc(rr, func(r e2eRun) bool { return r.hasPG }) {
		xs := each(rr, func(r e2eRun, _ int) float64 { return micros(r.pgCPU) })
		rs = append(rs, result{sec, prefix + c.name + "_pg_cpu_us_per_msg", median(xs), "us",
			"PostgreSQL CPU a message (the harness's backends, /proc schedstat); " + spread(xs)})
	}
	return rs
}

// pathResults are, on a sequential broker, where a message's time goes:
// in the chain (middleware and handler) and between one message's return
// and the next one's arrival (the broker's ack and delivery).
func pathResults(prefix string, c e2eCase, rr []e2eRun, each func([]e2eRun, func(e2eRun, int) float64) []float64) []result {
	const sec = "e2e"
	if !slices.ContainsFunc(rr, func(r e2eRun) bool { return r.gap > 0 }) {
		return nil
	}
	in := each(rr, func(r e2eRun, _ int) float64 { return micros(r.inChain) })
	gap := each(rr, func(r e2eRun, _ int) float64 { return micros(r.gap) })
	inMean := each(rr, func(r e2eRun, _ int) float64 { return micros(r.inChainMean) })
	gapMean := each(rr, func(r e2eRun, _ int) float64 { return micros(r.gapMean) })
	return []result{
		{sec, prefix + c.name + "_in_chain_p50_us", median(in), "us", "median time a message spends in the middleware and handler; " + spread(in)},
		{sec, prefix + c.name + "_in_chain_mean_us", median(inMean), "us", "the same, mean; " + spread(inMean)},
		{sec, prefix + c.name + "_broker_gap_p50_us", median(gap), "us", "median time from a message's return (its ack) to the next one's arrival; " + spread(gap)},
		{sec, prefix + c.name + "_broker_gap_mean_us", median(gapMean), "us", "the same, mean; " + spread(gapMean)},
	}
}

// spread says over how many rounds a median was taken, and its range.
func spread(xs []float64) string {
	if len(xs) == 1 {
		return "1 round"
	}
	return fmt.Sprintf("median of %d rounds (%s to %s)", len(xs), formatValue(slices.Min(xs)), formatValue(slices.Max(xs)))
}
