package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// run, in process, stops every goroutine it started before it returns:
// router, subscribers, store sweepers, the embedded Kafka, the metrics
// server.
func TestRunStopsEveryGoroutine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the example")
	}
	for _, tc := range []struct {
		name  string
		args  []string
		needs func(t *testing.T) []string
	}{
		{"gochannel/sqlite", []string{"-crash-rate=0.05"}, nil},
		{"gochannel/memory+metrics", []string{"-store=memory", "-metrics-addr=127.0.0.1:0", "-crash-rate=0.05", "-lease=200ms"}, nil},
		{"kafka-embedded/memory", []string{"-broker=kafka-embedded", "-store=memory"}, nil},
		{"kafka-embedded/memory/foreign", []string{"-broker=kafka-embedded", "-store=memory", "-producer=foreign"}, nil},
		{"amqp/redis", []string{"-broker=amqp", "-store=redis"}, func(t *testing.T) []string {
			return []string{"-amqp-url=" + testkit.RequireAMQP(t), "-redis-addr=" + testkit.RequireRedis(t)}
		}},
		{"amqp/memory/foreign", []string{"-broker=amqp", "-store=memory", "-producer=foreign"}, func(t *testing.T) []string {
			return []string{"-amqp-url=" + testkit.RequireAMQP(t)}
		}},
		{"postgres/postgres", []string{"-broker=postgres", "-store=postgres"}, func(t *testing.T) []string {
			return []string{"-postgres-dsn=" + testkit.RequirePostgres(t)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-events=60", "-cleanup", "-run-id=" + newTestRunID(), "-timeout=60s"}, tc.args...)
			if tc.needs != nil {
				args = append(args, tc.needs(t)...)
			}
			runLeavingNoGoroutine(t, args)
		})
	}
}

// runLeavingNoGoroutine runs the example in this process with args, fails
// t unless it exits OK, and then checks that every goroutine the run
// started has stopped.
func runLeavingNoGoroutine(t *testing.T, args []string) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	var stdout, stderr strings.Builder
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	code := run(ctx, args, &stdout, &stderr, func(string) string { return "" })
	cancel()
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	// goleak retries for a while: some goroutines (database/sql's
	// connection opener, pool reapers) exit just after Close.
	goleak.VerifyNone(t, ignore,
		// Sarama's metrics library starts one ticker per process,
		// on the first meter, and never stops it: not per run.
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
