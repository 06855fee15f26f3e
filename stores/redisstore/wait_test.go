package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup"
	dedupcycle "github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Config.WaitReplicas: acknowledged means replicated. These tests run
// on a primary with one replica of their own; TestClusterFailover runs
// the same on a Redis Cluster with replicas, through failovers.

func TestWaitReplicasConfig(t *testing.T) {
	for _, cfg := range []redisstore.Config{
		{WaitReplicas: -1},
		{WaitReplicas: redisstore.MaxWaitReplicas + 1},
		{WaitReplicas: 1, WaitTimeout: -time.Second},
		{WaitReplicas: 1, WaitTimeout: redisstore.MaxWaitTimeout + time.Millisecond},
		{WaitTimeout: time.Second}, // a timeout for a WAIT never sent
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("Validate(WaitReplicas %d, WaitTimeout %s) = nil, want an error", cfg.WaitReplicas, cfg.WaitTimeout)
		}
	}
	for _, cfg := range []redisstore.Config{
		{WaitReplicas: 1},
		{WaitReplicas: redisstore.MaxWaitReplicas, WaitTimeout: redisstore.MaxWaitTimeout},
		{WaitReplicas: 2, WaitTimeout: time.Nanosecond},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(WaitReplicas %d, WaitTimeout %s) = %v", cfg.WaitReplicas, cfg.WaitTimeout, err)
		}
	}

	// New: the WAIT must fit in the client's ReadTimeout (go-redis
	// bounds the pipeline that carries it by it), and the client must
	// let the store address each node.
	c := redis.NewClient(&redis.Options{Addr: testkit.ClosedAddr(t), ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	for _, cfg := range []redisstore.Config{
		{WaitReplicas: 1, WaitTimeout: 2 * time.Second, SkipServerCheck: true},
		{WaitReplicas: 1, WaitTimeout: 3 * time.Second, SkipServerCheck: true},
	} {
		if _, err := redisstore.New(c, cfg); err == nil {
			t.Errorf("New(WaitTimeout %s) on a client with ReadTimeout 2s succeeded", cfg.WaitTimeout)
		}
	}
	s, err := redisstore.New(c, redisstore.Config{WaitReplicas: 1, SkipServerCheck: true}) // the default 1s
	if err != nil {
		t.Fatalf("New(WaitReplicas 1) on a client with ReadTimeout 2s: %v", err)
	}
	_ = s.Close(context.Background())
	if _, err := redisstore.New(otherClient{c}, redisstore.Config{WaitReplicas: 1, SkipServerCheck: true}); err == nil {
		t.Error("New(WaitReplicas 1) on a client of another type succeeded")
	}
	if s, err := redisstore.New(otherClient{c}, redisstore.Config{SkipServerCheck: true}); err != nil {
		t.Errorf("New on a client of another type without WaitReplicas: %v", err)
	} else {
		_ = s.Close(context.Background())
	}
}

// otherClient is a UniversalClient of a type the store does not know.
type otherClient struct{ *redis.Client }

// replicated starts a primary with one replica and returns a client for
// the primary (ReadTimeout 10s: room for the WAITs of the tests) and the
// two servers.
func replicated(t *testing.T) (*redis.Client, *redistest.RedisServer, *redistest.RedisServer) {
	t.Helper()
	servers := redistest.StartRedisReplicated(t, 1)
	c := redis.NewClient(&redis.Options{Addr: servers[0].Addr, ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c, servers[0], servers[1]
}

// waitCfg is the configuration of the tests' stores with WaitReplicas:
// a WaitTimeout long enough that a replica that runs acknowledges in
// time on a loaded machine, below the client's ReadTimeout.
var waitCfg = redisstore.Config{WaitReplicas: 1, WaitTimeout: 5 * time.Second}

func TestWaitReplicas(t *testing.T) {
	c, _, replica := replicated(t)

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, factory(c, waitCfg), serverTime(c))
	})

	t.Run("ConformanceUnbatched", func(t *testing.T) {
		cfg := waitCfg
		cfg.Batch.Disabled = true
		storetest.Run(t, factory(c, cfg), serverTime(c))
	})

	t.Run("OneWaitPerPipeline", func(t *testing.T) {
		testOneWaitPerPipeline(t, c)
	})

	t.Run("CheckServer", func(t *testing.T) {
		log := watermill.NewCaptureLogger()
		cfg := waitCfg
		cfg.Logger = log
		s := newStore(t, c, cfg)
		if err := s.CheckServer(context.Background()); err != nil {
			t.Fatalf("CheckServer with WaitReplicas 1 on a primary with one replica: %v", err)
		}
		cfg.WaitReplicas = 2
		s = newStore(t, c, cfg)
		err := s.CheckServer(context.Background())
		errtest.Wraps(t, "CheckServer with WaitReplicas 2 on a primary with one replica", err, redisstore.ErrTooFewReplicas)
		if len(log.Captured()[watermill.ErrorLogLevel]) == 0 {
			t.Error("CheckServer logged nothing of the missing replica")
		}
	})

	for _, batched := range []bool{true, false} {
		name := "ReplicaStopped"
		if !batched {
			name += "Unbatched"
		}
		t.Run(name, func(t *testing.T) {
			cfg := waitCfg
			cfg.Batch.Disabled = !batched
			fresh := func(t *testing.T) redis.UniversalClient {
				f := redis.NewClient(c.Options())
				t.Cleanup(func() { _ = f.Close() })
				return f
			}
			testReplicaStopped(t, c, c, fresh, replica, cfg, func(_ *redisstore.Store, tag string) string { return tag })
		})
	}
}

// pipeTap records, for each pipeline that carries a command of the
// store (a key under prefix), the names of its commands.
type pipeTap struct {
	prefix string

	mu        sync.Mutex
	singles   int
	pipelines [][]string
}

func (h *pipeTap) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipeTap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmdKey(cmd), h.prefix) {
			h.mu.Lock()
			h.singles++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *pipeTap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		mine := false
		for _, c := range cmds {
			names = append(names, strings.ToLower(c.Name()))
			mine = mine || strings.HasPrefix(cmdKey(c), h.prefix)
		}
		if mine {
			h.mu.Lock()
			h.pipelines = append(h.pipelines, names)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// check fails t unless every pipeline of the store ended with its one
// WAIT and no store command went out alone, and returns the pipelines
// and the store commands in them.
func (h *pipeTap) check(t *testing.T) (pipelines, ops int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.singles != 0 {
		t.Errorf("%d store commands were sent alone, without a WAIT after them", h.singles)
	}
	for _, p := range h.pipelines {
		waits := 0
		for _, n := range p {
			if n == "wait" {
				waits++
			}
		}
		if waits != 1 || p[len(p)-1] != "wait" {
			t.Errorf("a pipeline of the store is %v: want one WAIT, last", p)
		}
		ops += len(p) - waits
	}
	return len(h.pipelines), ops
}

// testOneWaitPerPipeline: every call goes out with a WAIT after it, and
// concurrent calls share their pipeline's one WAIT.
func testOneWaitPerPipeline(t *testing.T, c *redis.Client) {
	ctx := context.Background()
	// Have the server load the scripts first, under another prefix:
	// a NOSCRIPT reply would send a call again, with its own WAIT.
	if err := cycle(ctx, newStore(t, c, waitCfg), watermill.NewUUID()); err != nil {
		t.Fatal(err)
	}
	cfg := waitCfg
	cfg.Prefix = testPrefix(t, c)
	h := &pipeTap{prefix: cfg.Prefix}
	c.AddHook(h)
	s := newStore(t, c, cfg)

	// A lone caller: one pipeline, one WAIT, per call.
	for range 5 {
		if err := cycle(ctx, s, watermill.NewUUID()); err != nil {
			t.Fatal(err)
		}
	}
	if pipelines, ops := h.check(t); pipelines != 10 || ops != 10 {
		t.Fatalf("5 claim+complete cycles from one caller: %d store commands in %d pipelines, want 10 in 10 (a WAIT each)", ops, pipelines)
	}

	const callers, cycles = 16, 20
	cycleConcurrently(t, s, callers, cycles)
	pipelines, ops := h.check(t)
	if want := 10 + 2*callers*cycles; ops != want {
		t.Fatalf("%d store commands, want %d", ops, want)
	}
	if pipelines*2 > ops {
		t.Fatalf("%d WAITs for %d commands: concurrent calls did not share their WAIT", pipelines, ops)
	}
	t.Logf("%d store commands in %d pipelines, each with one WAIT", ops, pipelines)
}

// testReplicaStopped stops replica (SIGSTOP) and checks what each call
// does while it acknowledges nothing: what wrote fails with
// ErrNotReplicated (not an outage) and a claim leaves nothing behind,
// what wrote nothing answers as usual; then resumes it and checks that
// the calls refused meanwhile were confirmed. keyFor returns the key
// of the claims the test makes for a tag (one served by replica's
// primary, in a cluster); primary is a client the test reads the
// records through; fresh makes a new client like client (with
// connections of its own).
func testReplicaStopped(t *testing.T, client, primary redis.UniversalClient, fresh func(t *testing.T) redis.UniversalClient, replica *redistest.RedisServer, cfg redisstore.Config, keyFor func(s *redisstore.Store, tag string) string) {
	ctx := context.Background()
	timeout := cfg.WaitTimeout
	cfg.WaitTimeout = 100 * time.Millisecond // the replica is stopped: every WAIT runs out
	s := newStore(t, client, cfg)
	keys := map[string][]string{}
	with := func(tag string) []string {
		if keys[tag] == nil {
			keys[tag] = []string{keyFor(s, tag)}
		}
		return keys[tag]
	}
	claim := func(what string, ks []string, want stores.Result) *stores.Claim {
		t.Helper()
		c, err := s.Claim(ctx, "h", ks, time.Minute)
		if err != nil || c.Result != want {
			t.Fatalf("%s: Claim = %v, %v; want %s", what, c, err, want)
		}
		return c
	}
	records := func(ks []string) []string {
		t.Helper()
		vals := make([]string, len(ks))
		for i, k := range ks {
			v, err := primary.Get(ctx, s.EncodeKey("h", k)).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			vals[i] = v
		}
		return vals
	}

	// Before the replica stops: a claim held, a record done, a lease run
	// out (taken over later).
	held := claim("held", with("held"), stores.Claimed)
	done := claim("done", with("done"), stores.Claimed)
	if err := s.Complete(ctx, done, time.Hour, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	claim("expired", with("expired"), stores.Claimed)
	for _, k := range with("expired") {
		age(t, client, 61*time.Second, s.EncodeKey("h", k)) // PX 2 min, lease 1 min: run out
	}
	expiredBefore := records(with("expired"))

	replica.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			replica.Resume()
		}
	}
	t.Cleanup(resume)

	notReplicated := func(what string, err error) {
		t.Helper()
		errtest.Wraps(t, what, err, redisstore.ErrNotReplicated)
		if errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrLostClaim) {
			t.Errorf("%s: %v is also of another class", what, err)
		}
	}

	// A claim that took its keys fails, and gives them back.
	_, err := s.Claim(ctx, "h", with("new"), time.Minute)
	notReplicated("Claim of new keys", err)
	for i, v := range records(with("new")) {
		if v != "" {
			t.Errorf("Claim of new keys failed but left key %q held: %q", with("new")[i], v)
		}
	}
	// A takeover too, and the lease it took over is put back.
	_, err = s.Claim(ctx, "h", with("expired"), time.Minute)
	notReplicated("Claim taking over a lease run out", err)
	for i, v := range records(with("expired")) {
		if v != expiredBefore[i] {
			t.Errorf("failed takeover of %q left %q, want the lease it took over back (%q)", with("expired")[i], v, expiredBefore[i])
		}
	}

	// Answers that wrote nothing wait for nothing.
	if c := claim("done, replica stopped", with("done"), stores.Duplicate); string(c.Data) != "kept" {
		t.Errorf("Duplicate data %q, want %q", c.Data, "kept")
	}
	claim("held, replica stopped", with("held"), stores.InProgress)

	// Fenced calls that applied fail; refused ones too until the WAIT
	// confirms the record they read.
	notReplicated("Extend", s.Extend(ctx, held, time.Minute))
	notReplicated("Complete", s.Complete(ctx, held, time.Hour, []byte("out")))
	for _, v := range records(with("held")) {
		if v != "dout" {
			t.Fatalf("the Complete that failed as not replicated did not write its record: %q", v)
		}
	}
	// Through a client of its own: a connection that wrote nothing yet.
	// From Redis 7.2 on a WAIT covers the writes of its own connection
	// only, and a refusal that wrote nothing would pass it at once (the
	// first Complete's connection still has its own write waiting);
	// Redis 7.0 moves a connection's WAIT offset on to the master's
	// after every command, write or not, so there the WAIT of this
	// refusal covers the first Complete either way.
	cfg.Prefix = s.Prefix()
	notReplicated("Complete again, its first attempt landed (refused, unconfirmed)", newStore(t, fresh(t), cfg).Complete(ctx, held, time.Hour, []byte("out")))
	notReplicated("Release after Complete (refused, unconfirmed)", newStore(t, fresh(t), cfg).Release(ctx, held))

	resume()
	cfg.WaitTimeout = timeout
	s = newStore(t, client, cfg) // same records, a WaitTimeout for a replica that runs
	if err := s.Complete(ctx, held, time.Hour, []byte("out")); !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("Complete again, the replica back: %v, want ErrLostClaim (the record is done, and replicated)", err)
	}
	if c := claim("held, completed", with("held"), stores.Duplicate); string(c.Data) != "out" {
		t.Errorf("Duplicate data %q, want %q", c.Data, "out")
	}
	claim("new, given back", with("new"), stores.Claimed)
	if c := claim("expired, put back", with("expired"), stores.Claimed); !c.Takeover {
		t.Error("the lease put back was not taken over")
	}
}

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
		prefix, slot, o := slotPrefix(t, admin)
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

	// slotStore returns a store on a slot of its own (slotOf), through a
	// tap on a client of its own (it reads the slot map on its first
	// call, and nothing reads it again until a reply tells it to), with
	// key done, its data "kept".
	slotStore := func(t *testing.T, key string) (s *redisstore.Store, tap *nodeTap, slot int64, owner, target string) {
		t.Helper()
		prefix, slot, owner, target := slotOf()
		tap = &nodeTap{prefix: prefix, waits: map[string]int{}}
		s = newStore(t, newClient(t, tap), redisstore.Config{WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Prefix: prefix})
		done := claim(s, key, stores.Claimed)
		if err := s.Complete(ctx, done, time.Hour, []byte("kept")); err != nil {
			t.Fatal(err)
		}
		return s, tap, slot, owner, target
	}

	t.Run("MOVED", func(t *testing.T) {
		s, tap, slot, owner, target := slotStore(t, "before")
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
		s, tap, slot, owner, target := slotStore(t, "old")
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
		fresh := newStore(t, newClient(t, nil), redisstore.Config{WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Prefix: s.Prefix()})
		for key, data := range map[string]string{"old": "kept", "held": "held", "new": "asked"} {
			if d := claim(fresh, key, stores.Duplicate); string(d.Data) != data {
				t.Errorf("%s: data %q, want %q", key, d.Data, data)
			}
		}
	})
}

// TestClusterReplicaLag runs on a Redis Cluster of three masters with a
// replica each that it starts itself, with WaitReplicas 1, and stops
// (SIGSTOP) one master's replica: as while a master has no synced
// replica after a failover, its WAITs run to their timeout. That lag
// must stay on that master's keys, and no call it cuts short may fail as
// an outage (which FailOpen runs handlers through, unprotected): a Claim
// the store's own WAIT held to its deadline fails with ErrNotReplicated.
func TestClusterReplicaLag(t *testing.T) {
	fc := startFaultCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 fc.addrs,
		ContextTimeoutEnabled: true,
		ReadTimeout:           10 * time.Second, // room for the WAITs
	})
	t.Cleanup(func() { _ = cc.Close() })

	// pause stops the replica of the i-th master, and returns that
	// master and another; the replica is resumed when t ends.
	pause := func(t *testing.T, i int) (lagging, healthy string, resume func()) {
		fc.waitOK(t, "before the replica stops")
		lagging, replica := fc.pair(t, i)
		healthy, _ = fc.pair(t, (i+1)%3)
		fc.byAddr[replica].Pause()
		resumed := false
		resume = func() {
			if !resumed {
				resumed = true
				fc.byAddr[replica].Resume()
			}
		}
		t.Cleanup(func() {
			resume()
			fc.waitOK(t, "after the replica resumed")
		})
		return lagging, healthy, resume
	}

	t.Run("LagStaysOnItsNode", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t, cc, redisstore.Config{WaitReplicas: 1, WaitTimeout: 9 * time.Second})
		lagging, healthy, resume := pause(t, 0)
		// Two claims on the lagging master's keys: each waits in a WAIT
		// there, one in each pipeline slot (Batch.MaxInFlight is 2).
		lagged := make(chan error, 2)
		for i := range 2 {
			k := keyOnNode(t, cc, s, "h", "lag"+strconv.Itoa(i), lagging)
			go func() {
				_, err := s.Claim(ctx, "h", []string{k}, time.Minute)
				lagged <- err
			}()
		}
		waitFor(t, time.Minute, "two clients of the lagging master blocked in WAIT", func() bool {
			return blockedClients(t, lagging) == 2
		})
		// The healthy master's keys are not held up by that: claims,
		// also of two keys (on the healthy master and a third one), and
		// Completes, answer while those WAITs still wait.
		third := ""
		for _, a := range fc.addrs {
			if m, _, _, err := replication(ctx, a); err == nil && m && a != lagging && a != healthy {
				third = a
			}
		}
		var wg sync.WaitGroup
		for i := range 8 {
			keys := []string{keyOnNode(t, cc, s, "h", "ok"+strconv.Itoa(i), healthy)}
			if i%2 == 1 {
				keys = append(keys, keyOnNode(t, cc, s, "h", "third"+strconv.Itoa(i), third))
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := s.Claim(ctx, "h", keys, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Errorf("Claim(%q) on healthy masters = %v, %v", keys, c, err)
					return
				}
				if err := s.Complete(ctx, c, time.Minute, nil); err != nil {
					t.Errorf("Complete(%q) on healthy masters: %v", keys, err)
				}
			}()
		}
		wg.Wait()
		if n := blockedClients(t, lagging); n != 2 || len(lagged) != 0 {
			t.Errorf("the calls on the healthy masters answered after the lagging master's WAITs ended (%d still blocked, %d lagging claims returned): they waited for them", n, len(lagged))
		}
		resume()
		for range 2 {
			if err := <-lagged; err != nil {
				t.Errorf("Claim on the lagging master, its replica resumed: %v", err)
			}
		}
	})

	for _, tc := range []struct {
		name string
		test func(t *testing.T, cc *redis.ClusterClient, pause func(*testing.T, int) (string, string, func()), unbatched bool)
	}{
		{"MultiKeyIsNotReplicated", testMultiKeyIsNotReplicated},
		{"DeadlineIsNotReplicated", testDeadlineIsNotReplicated},
	} {
		for _, batched := range []bool{true, false} {
			name := tc.name
			if !batched {
				name += "Unbatched"
			}
			t.Run(name, func(t *testing.T) {
				tc.test(t, cc, pause, !batched)
			})
		}
	}
}

// blockedClients reads INFO clients' blocked_clients of the server at
// addr.
func blockedClients(t *testing.T, addr string) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "clients").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no blocked_clients in INFO clients of %s", addr)
	return 0
}

// testDeadlineIsNotReplicated: with one master's replica stopped, Claims
// whose deadline (1s) is shorter than what the store's WAITs would take
// fail with ErrNotReplicated, never as an outage: a key held by a live
// claim (two round trips, each with its WAIT, before the answer), a
// lease run out (taken over, not confirmed, given back), a new key, two
// keys on two masters; and so do many at once, batched, with a
// WaitTimeout below the deadline.
func testDeadlineIsNotReplicated(t *testing.T, cc *redis.ClusterClient, pause func(*testing.T, int) (string, string, func()), unbatched bool) {
	ctx := context.Background()
	cfg := redisstore.Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second, Batch: redisstore.BatchConfig{Disabled: unbatched}}
	s := newStore(t, cc, cfg)
	lagging, healthy, _ := pause(t, 1)
	cfg.Prefix = s.Prefix()
	// Written before the replica stopped, through a store that does not
	// wait: a live claim, and a lease run out.
	plain := newStore(t, cc, redisstore.Config{Prefix: s.Prefix()})
	key := func(tag string) string { return keyOnNode(t, cc, s, "h", tag, lagging) }
	if c, err := plain.Claim(ctx, "h", []string{key("held")}, time.Minute); err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(held) = %v, %v", c, err)
	}
	if c, err := plain.Claim(ctx, "h", []string{key("expired")}, time.Minute); err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(expired) = %v, %v", c, err)
	}
	age(t, cc, 61*time.Second, s.EncodeKey("h", key("expired")))
	expiredBefore, err := cc.Get(ctx, s.EncodeKey("h", key("expired"))).Result()
	if err != nil {
		t.Fatal(err)
	}

	within := func(keys ...string) (*stores.Claim, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return s.Claim(ctx, "h", keys, time.Minute)
	}
	notOutage := func(what string, err error) {
		t.Helper()
		if dedupcycle.IsOutage(err) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v is an outage to the middleware: FailOpen would run the handler unprotected", what, err)
		}
	}
	notReplicated := func(what string, c *stores.Claim, err error) {
		t.Helper()
		notOutage(what, err)
		if !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Errorf("%s = %v, %v; want ErrNotReplicated", what, c, err)
		}
	}
	free := func(what string, keys ...string) {
		t.Helper()
		waitFor(t, time.Minute, what+" given back", func() bool {
			for _, k := range keys {
				if n, err := cc.Exists(ctx, s.EncodeKey("h", k)).Result(); err != nil || n != 0 {
					return false
				}
			}
			return true
		})
	}

	c, err := within(key("held"))
	notOutage("Claim of a key held", err)
	if err == nil && c.Result != stores.InProgress || err != nil && !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Errorf("Claim of a key held = %v, %v; want in progress (or, its answer late, not replicated)", c, err)
	}
	c, err = within(key("expired"))
	notReplicated("Claim taking over a lease run out", c, err)
	waitFor(t, time.Minute, "the lease taken over put back", func() bool {
		v, err := cc.Get(ctx, s.EncodeKey("h", key("expired"))).Result()
		return err == nil && v == expiredBefore
	})
	c, err = within(key("new"))
	notReplicated("Claim of a new key", c, err)
	free("the new key", key("new"))
	two := []string{keyOnNode(t, cc, s, "h", "two-ok", healthy), key("two-lag")}
	c, err = within(two...)
	notReplicated("Claim of two keys, one on the lagging master", c, err)
	free("the two keys", two...)

	// Many at once, batched together, with a WaitTimeout below the
	// deadline (500ms of 1s): a call waits for its slot, its keys one
	// after the other, and its WAIT.
	cfg.WaitTimeout = 500 * time.Millisecond
	s = newStore(t, cc, cfg)
	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		wg       sync.WaitGroup
	)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				tag := fmt.Sprintf("load-%d-%d", g, i)
				var keys []string
				switch i % 3 {
				case 0:
					keys = []string{key(tag)}
				case 1:
					keys = []string{keyOnNode(t, cc, s, "h", tag, healthy), key(tag + "-lag")}
				default:
					keys = []string{key(tag + "-lag"), keyOnNode(t, cc, s, "h", tag, healthy)}
				}
				c, err := within(keys...)
				mu.Lock()
				switch {
				case err == nil:
					outcomes[c.Result.String()]++
				case errors.Is(err, redisstore.ErrNotReplicated):
					outcomes["not replicated"]++
				default:
					outcomes[err.Error()]++
				}
				mu.Unlock()
				if err != nil {
					notReplicated(fmt.Sprintf("Claim(%q) under load", keys), c, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("claims under load: %v", outcomes)
}

// testMultiKeyIsNotReplicated: with one master's replica stopped, 160
// callers at once, each with a deadline of 10s (well past WaitTimeout,
// 1s, and the pool's timeout), make the calls whose WAITs are not a lane's: multi-key
// Claims (their keys taken, then confirmed by WAIT on each node), and
// Complete, Release, Extend of claims over two masters (every key read,
// then each written with WAIT). Each succeeds or fails with
// ErrNotReplicated, never as an outage: not context.DeadlineExceeded, an
// i/o timeout or the pool's timeout (the lagging master's connections
// are all in WAITs).
func testMultiKeyIsNotReplicated(t *testing.T, cc *redis.ClusterClient, pause func(*testing.T, int) (string, string, func()), unbatched bool) {
	bg := context.Background()
	cfg := redisstore.Config{WaitReplicas: 1, WaitTimeout: time.Second, Batch: redisstore.BatchConfig{Disabled: unbatched}}
	s := newStore(t, cc, cfg)
	lagging, healthy, _ := pause(t, 2)
	// The claims to complete, release and extend, through a store that
	// does not wait.
	plain := newStore(t, cc, redisstore.Config{Prefix: s.Prefix()})
	keys := func(tag string) []string {
		return []string{keyOnNode(t, cc, s, "h", tag+"-lag", lagging), keyOnNode(t, cc, s, "h", tag+"-ok", healthy)}
	}
	const callers = 160
	held := make([]*stores.Claim, callers)
	for g := range callers {
		if g%4 == 0 {
			continue // claims
		}
		c, err := plain.Claim(bg, "h", keys(fmt.Sprintf("held-%d", g)), time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %v, %v", c, err)
		}
		held[g] = c
	}
	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		wg       sync.WaitGroup
	)
	start := make(chan struct{})
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Longer than WaitTimeout and the pool's timeout, which the
			// calls must answer within, but not a race against a busy
			// machine: a deadline hit means a call hung.
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			var (
				what string
				err  error
			)
			switch g % 4 {
			case 0:
				what = "Claim"
				_, err = s.Claim(ctx, "h", keys(fmt.Sprintf("new-%d", g)), time.Minute)
			case 1:
				what = "Complete"
				err = s.Complete(ctx, held[g], time.Hour, nil)
			case 2:
				what = "Release"
				err = s.Release(ctx, held[g])
			default:
				what = "Extend"
				err = s.Extend(ctx, held[g], time.Minute)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				outcomes[what+" ok"]++
			case errors.Is(err, redisstore.ErrNotReplicated) && !dedupcycle.IsOutage(err):
				outcomes[what+" not replicated"]++
			default:
				outcomes[what+" failed otherwise"]++
				t.Errorf("%s of two keys, one on the lagging master = %v; want ErrNotReplicated (an outage to the middleware: %v)", what, err, dedupcycle.IsOutage(err))
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("calls: %v", outcomes)
}

// TestClusterReplicaLagFailOpen: a master of a Redis Cluster has no
// synced replica (it is stopped), and a fail-open consumer whose store
// calls time out a little after WaitTimeout gets many messages at once,
// claiming one key on that master, or two (one on another master), with
// a client pool smaller than the calls (they wait for connections the
// WAITs hold). No claim can be replicated: every one must fail with
// ErrNotReplicated, and no handler may run. A deadline, an i/o timeout
// or a pool timeout of the store's own making is an outage to the
// middleware, which FailOpen runs handlers through unprotected.
func TestClusterReplicaLagFailOpen(t *testing.T) {
	fc := startFaultCluster(t)
	for _, tc := range []struct {
		name        string
		unbatched   bool
		pool        int
		poolTimeout time.Duration
		inFlight    int
	}{
		{"Batched", false, 4, 0, 0},
		{"Unbatched", true, 4, 0, 0},
		{"BatchedPoolTimeout", false, 4, 300 * time.Millisecond, 0},
		{"UnbatchedPoolTimeout", true, 4, 300 * time.Millisecond, 0},
		{"BatchedWiderThanPool", false, 4, 300 * time.Millisecond, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:                 fc.addrs,
				ContextTimeoutEnabled: true,
				ReadTimeout:           10 * time.Second,
				PoolSize:              tc.pool,
				PoolTimeout:           tc.poolTimeout,
			})
			t.Cleanup(func() { _ = cc.Close() })
			s := newStore(t, cc, redisstore.Config{WaitReplicas: 1, WaitTimeout: time.Second,
				Batch: redisstore.BatchConfig{Disabled: tc.unbatched, MaxInFlight: tc.inFlight}})

			fc.waitOK(t, "before the replica stops")
			lagging, replica := fc.pair(t, 1)
			healthy, _ := fc.pair(t, 2)
			fc.byAddr[replica].Pause()
			t.Cleanup(func() {
				fc.byAddr[replica].Resume()
				fc.waitOK(t, "after the replica resumed")
			})

			var outages recorded
			mw, err := middleware.New(middleware.Config{
				Store: &recording{Store: s, errs: &outages},
				Scope: "h",
				Key: func(m *message.Message) ([]string, error) {
					if b := m.Metadata.Get("b"); b != "" {
						return []string{m.Metadata.Get("a"), b}, nil
					}
					return []string{m.Metadata.Get("a")}, nil
				},
				Policy: dedup.Policy{
					Lease:        time.Minute,
					Retention:    time.Hour,
					StoreTimeout: 1200 * time.Millisecond,
					OnStoreError: dedup.FailOpen,
					Logger:       watermill.NopLogger{},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int64
			h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
				ran.Add(1)
				return nil, nil
			})
			const n = 64
			msgs := make([]*message.Message, n)
			for i := range msgs {
				m := message.NewMessage(watermill.NewUUID(), []byte("p"))
				m.Metadata.Set("a", keyOnNode(t, cc, s, "h", fmt.Sprintf("a%d", i), lagging))
				if i%2 == 0 {
					m.Metadata.Set("b", keyOnNode(t, cc, s, "h", fmt.Sprintf("b%d", i), healthy))
				}
				msgs[i] = m
			}
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				other []string
			)
			start := make(chan struct{})
			for _, m := range msgs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if _, err := h(m); err != nil && !errorsIsNotReplicated(err) {
						mu.Lock()
						other = append(other, err.Error())
						mu.Unlock()
					}
				}()
			}
			close(start)
			wg.Wait()
			if r := ran.Load(); r > 0 || len(other) > 0 {
				t.Errorf("FailOpen with a master's replica stopped: %d of %d handlers ran unprotected; %d failed otherwise than not replicated, e.g. %v; store errors not ErrNotReplicated: %v", r, n, len(other), first(other), outages.list())
			}
		})
	}
}

func errorsIsNotReplicated(err error) bool {
	return errors.Is(err, redisstore.ErrNotReplicated)
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// recording is a store that records the errors of its calls that are
// not ErrNotReplicated.
type recording struct {
	stores.Store
	errs *recorded
}

func (r *recording) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c, err := r.Store.Claim(ctx, scope, keys, lease)
	r.errs.add(err)
	return c, err
}

type recorded struct {
	mu   sync.Mutex
	errs map[string]int
}

func (r *recorded) add(err error) {
	if err == nil || errors.Is(err, redisstore.ErrNotReplicated) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[string]int{}
	}
	r.errs[err.Error()]++
}

func (r *recorded) list() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}
