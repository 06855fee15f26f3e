package redisstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The error replies of a Redis that cannot serve now, reproduced on
// servers of the test's own: each reaches the caller as
// stores.ErrUnavailable. TestClassifyServerReplies checks the text of
// every reply; these check that the server and go-redis deliver them so.

// TestServerBusy: a server running a script past busy-reply-threshold
// answers BUSY.
func TestServerBusy(t *testing.T) {
	addr := startRedis(t, "--busy-reply-threshold", "50")
	// A Prefix of its own: this test's server holds nothing to delete.
	s := newStore(t, newClient(t, addr), redisstore.Config{Prefix: "busy:", Batch: redisstore.BatchConfig{Disabled: true}})
	other := newClient(t, addr)
	ctx := context.Background()
	go func() { _ = other.Eval(ctx, "while true do end", nil).Err() }()
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err = s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the script has not started yet
	}
	errtest.Wraps(t, "Claim while a script runs", err, stores.ErrUnavailable)
	if !strings.Contains(err.Error(), "BUSY") {
		t.Errorf("Claim while a script runs: %v, want BUSY", err)
	}
	admin := newClient(t, addr)
	for admin.ScriptKill(ctx).Err() != nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplicaWithoutPrimary: a replica (the old primary after a failover,
// or a client pointed at a replica) refuses writes with READONLY; with
// replica-serve-stale-data no and its primary gone it refuses everything
// with MASTERDOWN.
func TestReplicaWithoutPrimary(t *testing.T) {
	dead := startRedis(t)
	host, port, _ := strings.Cut(dead, ":")
	addr := startRedis(t, "--replicaof", host, port)
	c := newClient(t, addr)
	ctx := context.Background()
	// A Prefix of its own: nothing to delete afterwards (a replica
	// refuses it).
	for _, batched := range []bool{true, false} {
		s := newStore(t, c, redisstore.Config{Prefix: "replica:", Batch: redisstore.BatchConfig{Disabled: !batched}})
		_, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
		errtest.Wraps(t, "Claim on a replica", err, stores.ErrUnavailable)
		if err == nil || !strings.Contains(err.Error(), "READONLY") {
			t.Errorf("Claim on a replica: %v, want READONLY", err)
		}
	}
	// The primary goes away; the replica stops serving stale data.
	_ = newClient(t, dead).ShutdownNoSave(ctx).Err() // the connection closes: an error
	if err := c.ConfigSet(ctx, "replica-serve-stale-data", "no").Err(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, c, redisstore.Config{Prefix: "replica:"})
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err = s.Claim(ctx, "s", []string{"k2"}, time.Minute)
		if (err != nil && strings.Contains(err.Error(), "MASTERDOWN")) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the replica has not seen the link down yet
	}
	errtest.Wraps(t, "Claim on a replica whose primary is down", err, stores.ErrUnavailable)
	if err == nil || !strings.Contains(err.Error(), "MASTERDOWN") {
		t.Errorf("Claim on a replica whose primary is down: %v, want MASTERDOWN", err)
	}
}

// testClusterDown: a cluster with a slot no node serves answers
// CLUSTERDOWN (go-redis retries it, then returns it); a multi-key script
// on a slot being migrated whose keys are not all on the node answers
// TRYAGAIN. Both are outages. It changes the cluster: run it last.
func testClusterDown(t *testing.T, cc *redis.ClusterClient) {
	ctx := context.Background()
	p := "{" + storetest.NewID() + "}:"
	t.Cleanup(func() { deletePrefix(t, cc, p) })
	s := newStore(t, cc, redisstore.Config{Prefix: p, Batch: redisstore.BatchConfig{Disabled: true}})
	slot, err := cc.ClusterKeySlot(ctx, p).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner, err := cc.MasterForKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// Run before deletePrefix: the slot is served again, and stable.
	t.Cleanup(func() {
		_ = owner.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err()
		_ = owner.Do(ctx, "CLUSTER", "ADDSLOTS", slot).Err()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if info, err := owner.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:ok") {
				return
			}
		}
	})
	// One key of the claim exists on the owner, the other does not.
	held, err := s.Claim(ctx, "s", []string{"a"}, time.Minute)
	if err != nil || held.Result != stores.Claimed {
		t.Fatalf("Claim = %v, %v", held, err)
	}
	var (
		mu     sync.Mutex
		target string
	)
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		id, err := n.ClusterMyID(ctx).Result()
		if err == nil && n.Options().Addr != owner.Options().Addr {
			mu.Lock()
			target = id
			mu.Unlock()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := owner.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", target).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, "s", []string{"a", "b"}, time.Minute)
	errtest.Wraps(t, "Claim of two keys on a migrating slot", err, stores.ErrUnavailable)
	if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
		t.Errorf("Claim of two keys on a migrating slot: %v, want TRYAGAIN", err)
	}
	if err := owner.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
		t.Fatal(err)
	}

	// No node serves the slot: the cluster is down.
	if err := owner.Do(ctx, "CLUSTER", "DELSLOTS", slot).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err = s.Claim(ctx, "s", []string{"c"}, time.Minute)
		if (err != nil && strings.Contains(err.Error(), "CLUSTERDOWN")) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	errtest.Wraps(t, "Claim on a cluster that is down", err, stores.ErrUnavailable)
	if err == nil || !strings.Contains(err.Error(), "CLUSTERDOWN") {
		t.Errorf("Claim on a cluster that is down: %v, want CLUSTERDOWN", err)
	}
}
