package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// openRunStore opens the store of cfg for runID as a run does, and
// closes it and deletes what it wrote when t ends.
func openRunStore(t *testing.T, cfg Config, runID string) *dedupStore {
	t.Helper()
	var closers, removers teardown
	t.Cleanup(func() {
		ctx := context.Background()
		if err := removers.run(ctx, 10*time.Second); err != nil {
			t.Error(err)
		}
		if err := closers.run(ctx, 10*time.Second); err != nil {
			t.Error(err)
		}
	})
	st, err := openStore(t.Context(), cfg, runID, watermill.NopLogger{}, &closers, &removers)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A run keeps its records where a store with the default settings does
// not look, so that no tool reading such a store has to tell a run's
// from the store's own (#7). They were under "dedup:<run id>:", inside
// redisstore's default prefix, where dedupctl guessed which keys were a
// run's and took real records for them; and -run-id=inbox made a run's
// table sqlstore's default, dedup_inbox.
func TestRunRecordsOutsideTheStoresDefaults(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		cfg := defaultConfig()
		cfg.Store, cfg.RedisAddr = storeRedis, testkit.RequireRedis(t)
		runID := newTestRunID()
		st := openRunStore(t, cfg, runID)
		c, err := st.store.Claim(t.Context(), handlerName, []string{"payment:PAY-" + runID + "-evt-000001"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim: %+v, %v", c, err)
		}
		if err := st.store.Complete(t.Context(), c, time.Hour, nil); err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr})
		defer client.Close()
		var keys []string
		iter := client.Scan(t.Context(), 0, "*"+runID+"*", 1000).Iterator()
		for iter.Next(t.Context()) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Fatalf("no Redis key holds the run id %s", runID)
		}
		for _, k := range keys {
			for _, p := range []string{redisstore.DefaultPrefix, redisstore.DefaultCompactPrefix} {
				if strings.HasPrefix(k, p) {
					t.Errorf("the run's key %q is under redisstore's default prefix %q", k, p)
				}
			}
		}
	})
	t.Run("nats", func(t *testing.T) {
		cfg := defaultConfig()
		cfg.Store, cfg.NATSURL = storeNATS, testkit.RequireNATS(t)
		runID := newTestRunID()
		st := openRunStore(t, cfg, runID)
		c, err := st.store.Claim(t.Context(), handlerName, []string{"payment:PAY-" + runID + "-evt-000001"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim: %+v, %v", c, err)
		}
		bucket := runName(storeNATS, runID)
		if bucket == natsstore.DefaultBucket || !strings.Contains(bucket, runID) {
			t.Fatalf("the run %s keeps its records in the bucket %q, want one of its own, not natsstore's default", runID, bucket)
		}
		kv, err := natstest.JetStream(t, cfg.NATSURL).KeyValue(t.Context(), bucket)
		if err != nil {
			t.Fatalf("the run's bucket %s: %v", bucket, err)
		}
		if status, err := kv.Status(t.Context()); err != nil || status.Values() == 0 {
			t.Errorf("the run's claim is not in its bucket %s (%v)", bucket, err)
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		cfg := defaultConfig()
		cfg.Dir = t.TempDir()
		for _, runID := range []string{"inbox", newTestRunID()} {
			st := openRunStore(t, cfg, runID)
			if table := st.store.(*sqlstore.Store).Table(); table == sqlstore.DefaultTable {
				t.Errorf("-run-id=%s keeps its records in sqlstore's default table %s", runID, table)
			}
		}
	})
}
