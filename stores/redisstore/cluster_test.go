package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestCluster runs against a Redis Cluster of three masters that it starts
// itself from redis-server on free loopback ports and kills afterwards.
// It skips loudly without redis-server, and fails instead under CI.
func TestCluster(t *testing.T) {
	cc := startCluster(t)

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, factory(cc, redisstore.Config{}), serverTime(cc))
	})

	t.Run("ConformanceUnbatched", func(t *testing.T) {
		storetest.Run(t, factory(cc, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}}), serverTime(cc))
	})

	t.Run("Batching", func(t *testing.T) {
		testBatching(t, cc)
	})

	t.Run("AdminPages", func(t *testing.T) {
		testAdminPages(t, cc)
	})

	t.Run("KeysOfOneClaimOnDifferentSlots", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t, cc, redisstore.Config{})
		if !s.Sharded() {
			t.Fatal("a store on a ClusterClient does not use the one-key-per-script path")
		}
		// Find keys whose records hash to slots on different nodes, so the
		// claim really spans nodes (a CROSSSLOT would fail the claim).
		keys := keysOnDistinctNodes(t, cc, s, "h", 3)
		cl, err := s.Claim(ctx, "h", keys, time.Minute)
		if err != nil || cl.Result != stores.Claimed {
			t.Fatalf("Claim over three nodes = %v, %v", cl, err)
		}
		for _, k := range keys {
			if r, err := s.Claim(ctx, "h", []string{k}, time.Minute); err != nil || r.Result != stores.InProgress {
				t.Fatalf("Claim(%q) = %v, %v; want in_progress", k, r, err)
			}
		}
		if err := s.Extend(ctx, cl, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, cl, time.Minute, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, cl); !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Release after Complete: %v", err)
		}
		for _, k := range keys {
			if r, err := s.Claim(ctx, "h", []string{"new", k}, time.Minute); err != nil || r.Result != stores.Duplicate || string(r.Data) != "x" {
				t.Fatalf("Claim(new, %q) = %v, %v; want duplicate", k, r, err)
			}
		}
		// The failed claims above left "new" free.
		if r, _ := s.Claim(ctx, "h", []string{"new"}, time.Minute); r.Result != stores.Claimed {
			t.Fatalf("Claim(new) = %s: a failed claim left it held", r.Result)
		}
	})

	t.Run("UndoNeverHoldsTheCaller", func(t *testing.T) {
		testUndoNeverHoldsTheCaller(t, cc.Options().Addrs)
	})

	t.Run("UndoWaitsForNoOtherNode", func(t *testing.T) {
		testUndoWaitsForNoOtherNode(t, cc.Options().Addrs)
	})

	t.Run("FailedClaimKeepsExpiredLease", func(t *testing.T) {
		testFailedMultiKeyClaimKeepsExpiredLease(t, cc, newStore(t, cc, redisstore.Config{}))
	})

	t.Run("HashTagPrefix", func(t *testing.T) {
		// Every record in one slot: multi-key claims are single scripts.
		p := "{" + storetest.NewID() + "}:"
		t.Cleanup(func() { deletePrefix(t, cc, p) })
		s := newStore(t, cc, redisstore.Config{Prefix: p})
		if s.Sharded() {
			t.Fatal("a hash-tagged prefix still uses the one-key-per-script path")
		}
		testFailedMultiKeyClaimKeepsExpiredLease(t, cc, s)
	})

	t.Run("CheckServer", func(t *testing.T) {
		log := watermill.NewCaptureLogger()
		s := newStore(t, cc, redisstore.Config{Logger: log})
		if err := s.CheckServer(context.Background()); err != nil {
			t.Fatalf("CheckServer on the cluster: %v", err)
		}
		if n := len(log.Captured()[watermill.InfoLogLevel]) + len(log.Captured()[watermill.ErrorLogLevel]); n != 0 {
			t.Fatalf("CheckServer logged %v", log.Captured())
		}
	})

	// Last: it takes a slot away from the cluster.
	t.Run("TryAgainAndClusterDown", func(t *testing.T) {
		testClusterDown(t, cc)
	})
}

// keysOnDistinctNodes returns n keys whose records in scope live on n
// different cluster nodes.
func keysOnDistinctNodes(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, scope string, n int) []string {
	t.Helper()
	ctx := context.Background()
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := func(slot int64) string {
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("slot %d is not served", slot)
		return ""
	}
	seen := map[string]bool{}
	var keys []string
	for i := 0; len(keys) < n && i < 1000; i++ {
		k := "key-" + strings.Repeat("x", i%7) + storetest.NewID()
		slot, err := cc.ClusterKeySlot(ctx, s.EncodeKey(scope, k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if node := nodeOf(slot); !seen[node] {
			seen[node] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found keys on %d nodes only", len(keys))
	}
	return keys
}
