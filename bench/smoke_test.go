package main

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// TestSmoke runs the e2e cases against the hand-rolled SET NX and with
// the writing handler, and the replay, at -quick sizes on kfake (in
// process), and checks that they print their RESULT lines. It checks no
// speed: the figures are the harness's, not the tests'. A section whose
// service or program is missing fails the test, naming it (skips it under
// DEDUP_SKIP_MISSING=1).
func TestSmoke(t *testing.T) {
	ctx := context.Background()
	o := &options{
		quick:   true,
		brokers: map[string]bool{"kfake16": true},
		cases: map[string]bool{
			caseNaive.name: true, caseAsyncRedis.name: true, caseRedis.name: true,
			casePlainWrite.name: true, caseAsyncRedisWrite.name: true, caseTxWrite.name: true,
			// The replay's stores besides Redis.
			caseMemstore.name: true, casePostgres.name: true,
		},
	}
	want := []string{
		"e2e_kfake16_plain_cpu_us_per_msg",
		"e2e_kfake16_naive_setnx_redis_cpu_us_per_msg",
		"e2e_kfake16_dedup_async_redis_vs_naive_setnx_ratio",
		"e2e_kfake16_dedup_redis_vs_naive_setnx_ratio",
		"e2e_kfake16_dedup_async_redis_added_cpu_vs_naive_setnx_ratio",
		"e2e_kfake16_dedup_async_redis_redis_cpu_us_per_msg",
		"e2e_kfake16_dedup_async_redis_write_vs_plain_write_ratio",
		"e2e_kfake16_tx_postgres_write_vs_plain_write_ratio",
		"e2e_kfake16_tx_postgres_write_pg_cpu_us_per_msg",
		"e2e_kfake16_plain_write_pg_cpu_us_per_msg",
	}
	sections := []func(context.Context, *options) ([]result, error){runE2E}
	if !testing.Short() {
		sections = append(sections, runReplay)
		want = append(want,
			"replay_kfake16_dedup_redis_replay_vs_first_ratio",
			"replay_kfake16_dedup_postgres_replay_vs_first_ratio",
			"replay_kfake16_dedup_memstore_replay_vs_first_ratio",
		)
	}
	got := map[string]float64{}
	for _, run := range sections {
		rs, err := run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if strings.HasPrefix(r.note, "SKIPPED") {
				testkit.Missing(t, r.note)
			}
			if r.name != "" {
				got[r.name] = r.value
				t.Logf("RESULT %s=%s", r.name, formatValue(r.value))
			}
		}
	}
	for _, name := range want {
		v, ok := got[name]
		switch {
		case !ok:
			t.Errorf("no RESULT %s", name)
		case math.IsNaN(v) || math.IsInf(v, 0):
			t.Errorf("RESULT %s=%v", name, v)
		}
	}
}
