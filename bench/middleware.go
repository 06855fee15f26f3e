package main

import (
	"context"
	"testing"

	"github.com/watermill-dedup/dedup/bench/cases"
)

// runMiddleware measures the cost per message of a bare handler, the
// middleware on memstore and Watermill's Deduplicator, on the same
// message-id key and the same messages (the cases BenchmarkMiddleware runs).
func runMiddleware(_ context.Context, o *options) ([]result, error) {
	const sec = "middleware"
	ns := map[string]float64{}
	var rs []result
	for _, c := range cases.MiddlewareCases() {
		var best testing.BenchmarkResult
		// Best of a few runs: the figure is a cost floor, not a mean
		// disturbed by whatever else the machine does.
		for range o.scale(3, 3) {
			r := testing.Benchmark(func(b *testing.B) { cases.RunMiddleware(b, c) })
			if best.N == 0 || r.NsPerOp() < best.NsPerOp() {
				best = r
			}
		}
		name := metricName(c.Name)
		ns[c.Name] = float64(best.T.Nanoseconds()) / float64(best.N)
		rs = append(rs,
			result{sec, "middleware_" + name + "_ns_per_msg", ns[c.Name], "ns/msg", ""},
			result{sec, "middleware_" + name + "_allocs_per_msg", float64(best.AllocsPerOp()), "allocs/msg", ""},
		)
	}
	if base := ns["watermill-deduplicator"]; base > 0 {
		rs = append(rs, result{sec, "middleware_dedup_vs_deduplicator_ratio", ns["dedup-memstore"] / base, "x", "goal <= 0.5"})
	}
	rs = append(rs, result{sec, "middleware_dedup_minus_bare_ns", ns["dedup-memstore"] - ns["bare"], "ns/msg", "goal <= 1000"})
	return rs, nil
}
