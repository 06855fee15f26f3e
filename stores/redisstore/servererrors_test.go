package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
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
	p, slot, owner := slotPrefix(t, cc)
	t.Cleanup(func() { deletePrefix(t, cc, p) })
	s := newStore(t, cc, redisstore.Config{Prefix: p, Batch: redisstore.BatchConfig{Disabled: true}})
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

// TestErrorClasses: a Redis that cannot be reached fails every call with
// an error wrapping stores.ErrUnavailable, the only class a fail-open
// consumer may bypass; one that does not answer fails it by the call's
// deadline, also as an outage; bad input, a closed store and a context
// already done are other classes.
func TestErrorClasses(t *testing.T) {
	addr := testkit.RequireRedis(t)
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			direct := newClient(t, addr)
			p, c := proxiedClient(t, addr, redis.Options{MaxRetries: -1, DialTimeout: time.Second})
			s := newStore(t, c, redisstore.Config{Prefix: testPrefix(t, direct), Batch: redisstore.BatchConfig{Disabled: !batched}})
			bg := context.Background()
			held := testkit.MustClaim(t, s, "s", time.Minute, "held")

			p.Cut()
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			_, err := s.Claim(ctx, "s", []string{"a"}, time.Minute)
			errtest.Wraps(t, "Claim, connection refused", err, stores.ErrUnavailable)
			errtest.Wraps(t, "Extend, connection refused", s.Extend(ctx, held, time.Minute), stores.ErrUnavailable)
			errtest.Wraps(t, "Complete, connection refused", s.Complete(ctx, held, time.Hour, nil), stores.ErrUnavailable)
			errtest.Wraps(t, "Release, connection refused", s.Release(ctx, held), stores.ErrUnavailable)
			p.Restore()

			held = testkit.MustClaim(t, s, "s", time.Minute, "held2")
			p.Blackhole()
			testkit.GiveUpUnanswered(t, "a Redis", map[string]func(context.Context) error{
				"Claim":    func(ctx context.Context) error { _, err := s.Claim(ctx, "s", []string{"b"}, time.Minute); return err },
				"Complete": func(ctx context.Context) error { return s.Complete(ctx, held, time.Hour, nil) },
			})
			p.Restore()

			// Not outages.
			long := strings.Repeat("s", redisstore.DefaultMaxKeyLen+1)
			_, err = s.Claim(bg, long, []string{"k"}, time.Minute)
			errtest.NotOutage(t, "Claim with a scope over MaxKeyLen", err, stores.ErrInvalidArgument)
			errtest.ContextNotOutage(t, s, held)
			if err := s.Close(bg); err != nil {
				t.Fatal(err)
			}
			_, err = s.Claim(bg, "s", []string{"k"}, time.Minute)
			errtest.NotOutage(t, "Claim after Close", err, stores.ErrClosed)
		})
	}
}

// TestHugeDurations: a lease or retention of math.MaxInt64 means "for
// ever" (capped), not an overflow the server refuses.
func TestHugeDurations(t *testing.T) {
	c := newClient(t, testkit.RequireRedis(t))
	for _, batched := range []bool{true, false} {
		s := newStore(t, c, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: !batched}})
		ctx := context.Background()
		for _, keys := range [][]string{{"one"}, {"a", "b"}} {
			cl, err := s.Claim(ctx, "s", keys, math.MaxInt64)
			if err != nil || cl.Result != stores.Claimed {
				t.Fatalf("Claim(%q, MaxInt64) = %+v, %v", keys, cl, err)
			}
			if err := s.Extend(ctx, cl, math.MaxInt64); err != nil {
				t.Fatalf("Extend(MaxInt64): %v", err)
			}
			if again, err := s.Claim(ctx, "s", keys, time.Second); err != nil || again.Result != stores.InProgress {
				t.Fatalf("Claim of a key held for ever = %+v, %v; want InProgress", again, err)
			}
			if err := s.Complete(ctx, cl, math.MaxInt64, []byte("x")); err != nil {
				t.Fatalf("Complete(MaxInt64): %v", err)
			}
			if dup, err := s.Claim(ctx, "s", keys, time.Second); err != nil || dup.Result != stores.Duplicate {
				t.Fatalf("Claim after Complete(MaxInt64) = %+v, %v; want Duplicate", dup, err)
			}
		}
	}
}

// TestOutOfMemoryStillAnswersDuplicates: a Redis at its maxmemory with
// the noeviction policy the store requires refuses writes but serves
// reads. A delivery whose record is done must still be found a
// Duplicate: a single-key claim's SET ... NX GET is a write, refused with
// OOM, which must not end the claim. A new key's claim fails with OOM,
// unclassified: a full Redis is a setting to fix (maxmemory), as a NATS
// bucket at its limits is, not an outage a fail-open consumer may run
// its handlers through unprotected.
func TestOutOfMemoryStillAnswersDuplicates(t *testing.T) {
	addr := startRedis(t, "--maxmemory-policy", "noeviction")
	c := newClient(t, addr)
	for _, batched := range []bool{true, false} {
		s := newStore(t, c, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: !batched}})
		ctx := context.Background()
		done, err := s.Claim(ctx, "s", []string{fmt.Sprint("done-", batched)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, done, time.Hour, []byte("out")); err != nil {
			t.Fatal(err)
		}
		// This test's own server is out of memory from now on.
		if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Fatalf("a write on a server with maxmemory 1: %v, want OOM", err)
		}
		dup, err := s.Claim(ctx, "s", done.Keys, time.Minute)
		if err != nil || dup.Result != stores.Duplicate || string(dup.Data) != "out" {
			t.Fatalf("Claim of a done key on a Redis out of memory = %+v, %v; want Duplicate with its data", dup, err)
		}
		_, err = s.Claim(ctx, "s", []string{fmt.Sprint("new-", batched)}, time.Minute)
		if err == nil || !strings.Contains(err.Error(), "OOM") || errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("Claim of a new key on a Redis out of memory: %v, want an unclassified OOM", err)
		}
		if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
}
