package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// A router that cannot start says why: the Redis stream the run would
// read is a string key (WRONGTYPE), and the summary and stderr name the
// server's error instead of only "it stopped before it ran".
func TestExampleShowsWhyTheRouterDidNotStart(t *testing.T) {
	t.Parallel()
	addr := testkit.RequireRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	runID := newTestRunID()
	topic := "payment.completed." + runID
	if err := rdb.Set(context.Background(), topic, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Del(context.Background(), topic).Err() })

	r := runExample(t, runID, "-broker=redis-streams", "-store=memory", "-events=10")
	if r.code == exitOK {
		t.Fatalf("exit 0 on a topic that is a string key\n%s", r)
	}
	if !strings.Contains(r.invariant(), "WRONGTYPE") {
		t.Errorf("the verdict does not say why the router stopped: %q\n%s", r.invariant(), r)
	}
	if !strings.Contains(r.stderr, "WRONGTYPE") {
		t.Errorf("stderr does not show the server's error\n%s", r)
	}
}
