package redisstore_test

import (
	"context"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// testWaitRedirects: with WaitReplicas the store groups its calls by
// node itself, so it must follow MOVED and ASK itself, and WAIT on the
// node that took the write. A slot moved to another master after the
// store's client read the slot map (MOVED: the client's next call goes
// to the old owner), and a slot being migrated (ASK for a key the old
// owner no longer has; a key still there is served there). Each write
// is confirmed by a WAIT on the node that made it, and every record is
// where the cluster serves it once the migration ends. It moves two
// slots of the test's own prefixes (hash tags) between masters.
func testWaitRedirects(t *testing.T, fc *faultCluster, newClient func(t *testing.T, tap *nodeTap, addrs ...string) *redis.ClusterClient) {
	ctx := context.Background()
	admin := newClient(t, nil)
	var (
		mu      sync.Mutex
		masters = map[string]*redis.Client{} // by address
		ids     = map[string]string{}        // node id by address
	)
	if err := admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		id, err := c.ClusterMyID(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		masters[c.Options().Addr], ids[c.Options().Addr] = c, id
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// slotOf returns a prefix whose keys all hash to one slot, that slot,
	// its owner and another master.
	slotOf := func() (prefix string, slot int64, owner, target string) {
		prefix = "{" + storetest.NewID() + "}:"
		slot, err := admin.ClusterKeySlot(ctx, prefix).Result()
		if err != nil {
			t.Fatal(err)
		}
		o, err := admin.MasterForKey(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		owner = o.Options().Addr
		for a := range masters {
			if a != owner {
				target = a
				break
			}
		}
		return prefix, slot, owner, target
	}
	setslot := func(addr string, args ...any) {
		t.Helper()
		if err := masters[addr].Do(ctx, append([]any{"cluster", "setslot"}, args...)...).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %v on %s: %v", args, addr, err)
		}
	}
	// migrate starts moving slot from owner to target.
	migrate := func(slot int64, owner, target string) {
		setslot(target, slot, "importing", ids[owner])
		setslot(owner, slot, "migrating", ids[target])
	}
	// finish moves the keys of slot left on owner to target, and gives
	// target the slot, telling every master.
	finish := func(slot int64, owner, target string) {
		t.Helper()
		keys, err := masters[owner].ClusterGetKeysInSlot(ctx, int(slot), 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			host, port, _ := net.SplitHostPort(target)
			args := []any{"migrate", host, port, "", 0, 10000, "keys"}
			for _, k := range keys {
				args = append(args, k)
			}
			if err := masters[owner].Do(ctx, args...).Err(); err != nil {
				t.Fatalf("MIGRATE %d keys of slot %d to %s: %v", len(keys), slot, target, err)
			}
		}
		setslot(target, slot, "node", ids[target])
		setslot(owner, slot, "node", ids[target])
		for a := range masters {
			if a != owner && a != target {
				setslot(a, slot, "node", ids[target])
			}
		}
		fc.waitOK(t, "after moving a slot")
	}
	cfg := redisstore.Config{WaitReplicas: 1, WaitTimeout: waitCfg.WaitTimeout}
	claim := func(s *redisstore.Store, key string, want stores.Result) *stores.Claim {
		t.Helper()
		c, err := s.Claim(ctx, "h", []string{key}, time.Minute)
		if err != nil || c.Result != want {
			t.Fatalf("Claim(%q) = %v, %v; want %s", key, c, err, want)
		}
		return c
	}
	// checkTap fails t unless every pipeline with a write of the tap's
	// prefix ended with its one WAIT, and returns how many went to each
	// node (redirected attempts included).
	checkTap := func(tap *nodeTap) map[string]int {
		t.Helper()
		tap.mu.Lock()
		defer tap.mu.Unlock()
		if len(tap.bad) > 0 {
			t.Fatalf("pipelines without their one WAIT, last: %v", tap.bad)
		}
		out := maps.Clone(tap.waits)
		clear(tap.waits)
		return out
	}
	// replicated fails t unless the records of keys are on the replica
	// of master: each call returned after a WAIT on the node that wrote
	// it, which counted that replica. SCAN, not GET: a replica answers
	// MOVED for a key of a slot its master is importing, but its keyspace
	// holds what it received.
	replicated := func(s *redisstore.Store, master string, keys ...string) {
		t.Helper()
		_, replica, _, err := replication(ctx, master)
		if err != nil || replica == "" {
			t.Fatalf("the replica of %s: %q, %v", master, replica, err)
		}
		rc := redis.NewClient(&redis.Options{Addr: replica})
		defer rc.Close()
		for _, k := range keys {
			key := s.EncodeKey("h", k)
			var found bool
			iter := rc.Scan(ctx, 0, redisstore.GlobEscape(key), 1000).Iterator()
			for iter.Next(ctx) {
				found = found || iter.Val() == key
			}
			if err := iter.Err(); err != nil || !found {
				t.Errorf("%s: acknowledged, but not on %s, the replica of %s, which wrote it (%v)", k, replica, master, err)
			}
		}
	}

	t.Run("MOVED", func(t *testing.T) {
		prefix, slot, owner, target := slotOf()
		tap := &nodeTap{prefix: prefix, waits: map[string]int{}}
		// A client of its own: it reads the slot map on its first call,
		// and nothing reads it again until a reply tells it to.
		s := newStore(t, newClient(t, tap), redisstore.Config{WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Prefix: prefix})
		done := claim(s, "before", stores.Claimed)
		if err := s.Complete(ctx, done, time.Hour, []byte("kept")); err != nil {
			t.Fatal(err)
		}
		checkTap(tap)
		migrate(slot, owner, target)
		finish(slot, owner, target)

		c := claim(s, "after", stores.Claimed) // sent to owner, which answers MOVED
		if s.Redirects() == 0 {
			t.Fatal("no MOVED followed: the client knew of the move")
		}
		replicated(s, target, "after")
		if err := s.Complete(ctx, c, time.Hour, []byte("moved")); err != nil {
			t.Fatal(err)
		}
		if w := checkTap(tap); w[target] < 2 {
			t.Fatalf("pipelines with a WAIT after the move: %v, want the claim's and the Complete's on %s", w, target)
		}
		replicated(s, target, "before", "after")
		for key, data := range map[string]string{"before": "kept", "after": "moved"} {
			if d := claim(s, key, stores.Duplicate); string(d.Data) != data {
				t.Errorf("%s: data %q, want %q", key, d.Data, data)
			}
		}
	})

	t.Run("ASK", func(t *testing.T) {
		prefix, slot, owner, target := slotOf()
		tap := &nodeTap{prefix: prefix, waits: map[string]int{}}
		s := newStore(t, newClient(t, tap), redisstore.Config{WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Prefix: prefix})
		done := claim(s, "old", stores.Claimed)
		if err := s.Complete(ctx, done, time.Hour, []byte("kept")); err != nil {
			t.Fatal(err)
		}
		held := claim(s, "held", stores.Claimed)
		checkTap(tap)
		migrate(slot, owner, target)
		finished := false
		t.Cleanup(func() {
			if !finished {
				finish(slot, owner, target)
			}
		})

		// A key the owner does not have: ASK, to the target.
		c := claim(s, "new", stores.Claimed)
		asked := s.Redirects()
		if asked == 0 {
			t.Fatal("no ASK followed for a key the migrating owner does not have")
		}
		replicated(s, target, "new")
		if err := s.Complete(ctx, c, time.Hour, []byte("asked")); err != nil {
			t.Fatal(err)
		}
		if s.Redirects() != asked+1 {
			t.Errorf("%d redirects followed, want %d (the claim's ASK, then the Complete's)", s.Redirects(), asked+1)
		}
		if w := checkTap(tap); w[target] != 2 {
			t.Fatalf("pipelines with a WAIT of a key being imported: %v, want the claim's and the Complete's on %s", w, target)
		}
		// Keys the owner still has: served there, no redirect.
		if d := claim(s, "old", stores.Duplicate); string(d.Data) != "kept" {
			t.Errorf("old: data %q, want %q", d.Data, "kept")
		}
		if err := s.Complete(ctx, held, time.Hour, []byte("held")); err != nil {
			t.Fatal(err)
		}
		if s.Redirects() != asked+1 {
			t.Errorf("%d redirects followed, want %d: the keys the owner has are served there", s.Redirects(), asked+1)
		}
		replicated(s, owner, "old", "held")
		if w := checkTap(tap); w[target] != 0 {
			t.Fatalf("pipelines with a WAIT of keys the owner has: %v, want none on %s", w, target)
		}

		finish(slot, owner, target)
		finished = true
		fresh := newStore(t, newClient(t, nil), redisstore.Config{WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Prefix: prefix})
		for key, data := range map[string]string{"old": "kept", "held": "held", "new": "asked"} {
			if d := claim(fresh, key, stores.Duplicate); string(d.Data) != data {
				t.Errorf("%s: data %q, want %q", key, d.Data, data)
			}
		}
	})
}
