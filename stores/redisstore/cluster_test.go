package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestCluster runs against a Redis Cluster of three masters that it starts
// itself from redis-server on free loopback ports and kills afterwards.
// Without redis-server it fails naming the program and its Debian package
// (it skips only when DEDUP_SKIP_MISSING=1 asks for it, outside CI).
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

// TestClusterFencedCallsAllOrNothing: in Redis Cluster the keys of a claim
// live on different nodes, and Complete, Release and Extend apply key by
// key after checking every key. A key forgotten between the check and its
// apply (here: a 1ns lease, whose record the server keeps 2ms) fails the
// call with ErrLostClaim; the keys applied before must be put back, so the
// call changes nothing.
func TestClusterFencedCallsAllOrNothing(t *testing.T) {
	cc := startCluster(t)
	s := newStore(t, cc, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}})
	ctx := context.Background()
	lost := 0
	for range 400 {
		keys := keysOnDistinctNodes(t, cc, s, "s", 3)
		c, err := s.Claim(ctx, "s", keys, time.Nanosecond)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(%q) = %+v, %v", keys, c, err)
		}
		time.Sleep(1700*time.Microsecond + rand.N(600*time.Microsecond))
		extendErr := s.Extend(ctx, c, time.Hour)
		if extendErr == nil {
			_ = s.Release(ctx, c)
			continue
		}
		if !errors.Is(extendErr, stores.ErrLostClaim) {
			t.Fatalf("Extend: %v", extendErr)
		}
		lost++
		for _, k := range keys {
			ttl, err := cc.PTTL(ctx, s.EncodeKey("s", k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl > time.Minute {
				t.Fatalf("Extend failed with %v, yet key %q is now leased for %s: the call was partly applied", extendErr, k, ttl)
			}
		}
	}
	if lost == 0 {
		t.Skip("no Extend met a forgotten key in 300 tries")
	}
}

// TestClusterClaimUndoKeepsWhatItTookOver: a multi-key claim in Redis
// Cluster that took over an expired lease, then found another key held,
// puts the expired record back, also when its own record (of a 1ns lease,
// kept 2ms) is gone by then: the previous owner, whose lease ended less
// than one lease ago, still owns its record and can Complete it.
func TestClusterClaimUndoKeepsWhatItTookOver(t *testing.T) {
	cc := startCluster(t)
	s := newStore(t, cc, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}})
	ctx := context.Background()
	// The previous owner's lease is an hour, run out by ageing its record
	// (see age): its record is kept for most of another hour, however
	// slow the machine, so only the claim under test can take it away.
	const lease = time.Hour
	for try := range 5 {
		keys := keysOnDistinctNodes(t, cc, s, "s", 2)
		a, b := keys[0], keys[1]
		if s.EncodeKey("s", a) > s.EncodeKey("s", b) {
			a, b = b, a // claims take keys in ascending order: A first
		}
		c1, err := s.Claim(ctx, "s", []string{a}, lease)
		if err != nil || c1.Result != stores.Claimed {
			t.Fatal(c1, err)
		}
		if c, err := s.Claim(ctx, "s", []string{b}, time.Hour); err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		age(t, cc, lease+20*time.Millisecond, s.EncodeKey("s", a)) // c1's lease ran out
		// Keep B's node busy for a few ms, so the claim's undo of A comes
		// after its own 1ns record of A expired.
		busy := make(chan struct{})
		go func() {
			defer close(busy)
			_ = spin.Run(ctx, cc, []string{s.EncodeKey("s", b)}, 5).Err()
		}()
		time.Sleep(200 * time.Microsecond)
		c, err := s.Claim(ctx, "s", []string{a, b}, time.Nanosecond)
		<-busy
		if err != nil || c.Result != stores.InProgress {
			t.Fatalf("try %d: Claim(A, B) = %+v, %v; want InProgress (B is held)", try, c, err)
		}
		if err := s.Complete(ctx, c1, time.Hour, nil); err != nil {
			t.Fatalf("try %d: the previous owner's Complete after the failed claim = %v; its record must be put back", try, err)
		}
	}
}

// spin keeps a node busy for ARGV[1] ms.
var spin = redis.NewScript(`
local t = redis.call('TIME')
local until_us = t[1] * 1000000 + t[2] + ARGV[1] * 1000
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] >= until_us
return 0
`)

// cutHook cuts the first write (a script call) on key after it is armed,
// as a failover between the writes of a multi-key Complete would: "again"
// sends it twice (its reply was lost, and go-redis sent it again: the
// second finds the key done), "fail" fails it unsent. It holds the
// script calls on hold other than the claim's (token: a put-back) until
// release is closed, noting the first in held.
type cutHook struct {
	mu        sync.Mutex
	key, hold string
	mode      string
	token     string
	held      chan struct{}
	heldOnce  sync.Once
	release   chan struct{}
}

var errCut = errors.New("cut: the node failed over")

func (h *cutHook) arm(key, hold, token, mode string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.hold, h.token, h.mode = key, hold, token, mode
	h.held, h.heldOnce, h.release = make(chan struct{}), sync.Once{}, make(chan struct{})
}

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.process(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.process(ctx, cmds, next) }
}

func (h *cutHook) process(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
	h.mu.Lock()
	cut, hold := false, false
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); n != "evalsha" && n != "eval" {
			continue
		}
		switch k := cmdKey(c); {
		case k == h.key && h.key != "":
			cut = true
		case k == h.hold && h.hold != "":
			// EVALSHA sha 1 key ARGV[1]...
			hold = len(c.Args()) > 4 && c.Args()[4] != h.token
		}
	}
	key, mode, held, release := h.key, h.mode, h.held, h.release
	if cut {
		h.key, h.mode = "", "" // once
	}
	h.mu.Unlock()
	switch {
	case cut && mode == "fail":
		for _, c := range cmds {
			c.SetErr(errCut)
		}
		return errCut
	case cut && mode == "again":
		err := next(ctx, cmds)
		for _, c := range cmds {
			if cmdKey(c) == key && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				// Not run: the store sends it again with EVAL.
				h.mu.Lock()
				h.key, h.mode = key, mode
				h.mu.Unlock()
				return err
			}
		}
	case hold:
		h.heldOnce.Do(func() { close(held) })
		<-release
	}
	return next(ctx, cmds)
}

// TestClusterCompleteCutPartWay: a Complete of a claim whose keys are on
// two nodes, cut part-way (one key's write lost its reply and was sent
// again, or failed unsent), returns nil only once every key is done;
// otherwise an error that is not ErrLostClaim (the claim lost no key),
// and a retry completes the rest, also while a put-back of the key
// written first is still under way. Then every key is done, with the
// Complete's data: no key is left processing, to be taken over and run
// again after its lease.
func TestClusterCompleteCutPartWay(t *testing.T) {
	addrs := startCluster(t).Options().Addrs
	h := &cutHook{}
	cc := hookedCluster(t, addrs, h)
	for _, mode := range []string{"again", "fail"} {
		for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
			t.Run(fmt.Sprintf("%s/unbatched=%v", mode, batch.Disabled), func(t *testing.T) {
				bg := context.Background()
				s, err := redisstore.New(cc, redisstore.Config{Prefix: testPrefix(t, cc), SkipServerCheck: true, Batch: batch})
				if err != nil {
					t.Fatal(err)
				}
				keys := keysOnDistinctNodes(t, cc, s, "h", 2)
				c, err := s.Claim(bg, "h", keys, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(%q) = %v, %v", keys, c, err)
				}
				h.arm(s.EncodeKey("h", keys[1]), s.EncodeKey("h", keys[0]), c.Token, mode)
				release := closer(t, h.release)
				// The caller waits for a put-back while its context lasts:
				// it ends once one is held.
				ctx, cancel := context.WithCancel(bg)
				stop := make(chan struct{})
				go func() {
					select {
					case <-h.held:
						cancel()
					case <-stop:
					}
				}()
				err = s.Complete(ctx, c, time.Hour, []byte("x"))
				close(stop)
				cancel()
				// The middleware retries a Complete that failed otherwise
				// than with ErrLostClaim.
				for try := 1; err != nil; try++ {
					if errors.Is(err, stores.ErrLostClaim) {
						t.Fatalf("Complete(%q) cut part-way (%s), try %d = %v: the claim lost no key", keys, mode, try, err)
					}
					if try == 3 {
						t.Fatalf("Complete(%q) cut part-way (%s) still fails after %d tries: %v", keys, mode, try, err)
					}
					err = s.Complete(bg, c, time.Hour, []byte("x"))
				}
				release()
				if err := s.Close(bg); err != nil { // waits for the put-backs
					t.Fatal(err)
				}
				check := newStore(t, cc, redisstore.Config{Prefix: s.Prefix()})
				for _, k := range keys {
					if r, err := check.Claim(bg, "h", []string{k}, time.Minute); err != nil || r.Result != stores.Duplicate || string(r.Data) != "x" {
						t.Errorf("Claim(%q) after the Complete returned nil = %v, %v; want duplicate with data %q", k, r, err, "x")
					}
				}
				if err := check.Complete(bg, c, time.Hour, []byte("x")); !errors.Is(err, stores.ErrLostClaim) {
					t.Errorf("Complete of a claim completed already = %v; want ErrLostClaim", err)
				}
			})
		}
	}
}

// clusterTap is a hook on a cluster client that records the keys of the
// store's single-key SET commands and lets a test act on a pipeline
// before it is sent, or on its replies after.
type clusterTap struct {
	prefix string

	mu    sync.Mutex
	sets  []string
	delay map[string]time.Duration                                               // per key: the first command with it is held this long
	pipe  func(ctx context.Context, cmds []redis.Cmder, send func() error) error // when set: sends (or not) a pipeline with a store key
}

func (h *clusterTap) setKeys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sets)
}

// setPipe makes h run the pipelines with a store key through pipe until
// t ends.
func (h *clusterTap) setPipe(t *testing.T, pipe func(ctx context.Context, cmds []redis.Cmder, send func() error) error) {
	h.mu.Lock()
	h.pipe = pipe
	h.mu.Unlock()
	t.Cleanup(func() { h.mu.Lock(); h.pipe = nil; h.mu.Unlock() })
}

func (h *clusterTap) hold(k string) {
	h.mu.Lock()
	d := h.delay[k]
	delete(h.delay, k)
	h.mu.Unlock()
	if d > 0 {
		// A slow node: its reply comes d later.
		t := time.NewTimer(d)
		defer t.Stop()
		<-t.C
	}
}

func (h *clusterTap) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *clusterTap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k := cmdKey(cmd); strings.HasPrefix(k, h.prefix) {
			if name, _ := cmd.Args()[0].(string); strings.EqualFold(name, "set") {
				h.mu.Lock()
				h.sets = append(h.sets, k)
				h.mu.Unlock()
			}
			h.hold(k)
		}
		return next(ctx, cmd)
	}
}

func (h *clusterTap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		pipe := h.pipe
		h.mu.Unlock()
		mine := false
		for _, c := range cmds {
			if k := cmdKey(c); strings.HasPrefix(k, h.prefix) {
				mine = true
				h.hold(k)
			}
		}
		if pipe != nil && mine {
			return pipe(ctx, cmds, func() error { return next(ctx, cmds) })
		}
		return next(ctx, cmds)
	}
}

// isScriptOn reports whether cmd runs a script on key.
func isScriptOn(cmd redis.Cmder, key string) bool {
	name, _ := cmd.Args()[0].(string)
	return (strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval")) && cmdKey(cmd) == key
}

// TestClusterMultiKeyProtocol: how a multi-key call on keys of different
// Redis Cluster nodes keeps the contract, key by key.
func TestClusterMultiKeyProtocol(t *testing.T) {
	cc := startCluster(t)
	ctx := context.Background()
	cfg := redisstore.Config{Prefix: testPrefix(t, cc), Batch: redisstore.BatchConfig{Disabled: true}}
	tap := &clusterTap{prefix: cfg.Prefix, delay: map[string]time.Duration{}}
	cc.AddHook(tap)
	s := newStore(t, cc, cfg)
	// side reaches the nodes without the tap.
	side := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cc.Options().Addrs})
	t.Cleanup(func() { _ = side.Close() })
	pttl := func(k string) time.Duration {
		t.Helper()
		d, err := side.PTTL(ctx, s.EncodeKey("s", k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// ascending returns keys sorted by their Redis keys, and the Redis keys.
	ascending := func(keys []string) ([]string, []string) {
		slices.SortFunc(keys, func(a, b string) int { return strings.Compare(s.EncodeKey("s", a), s.EncodeKey("s", b)) })
		rks := make([]string, len(keys))
		for i, k := range keys {
			rks[i] = s.EncodeKey("s", k)
		}
		return keys, rks
	}

	// Competing claims of shared keys take them in one order, so that one
	// of them gets them all: ascending Redis-key order, whatever order the
	// claim lists them in.
	t.Run("ClaimTakesKeysInAscendingOrder", func(t *testing.T) {
		keys, rks := ascending(keysOnDistinctNodes(t, cc, s, "s", 3))
		before := len(tap.setKeys())
		c, err := s.Claim(ctx, "s", []string{keys[2], keys[0], keys[1]}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		if got := tap.setKeys()[before:]; !slices.Equal(got, rks) {
			t.Fatalf("claimed keys in the order %q, want ascending %q", got, rks)
		}
		if err := s.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	})

	// A claim that took over an expired lease and then found another key
	// held puts the expired record back with what was left of its TTL,
	// less the time since: never longer than it would have lived.
	t.Run("UndoneTakeoverKeepsItsRemainingTTL", func(t *testing.T) {
		keys, rks := ascending(keysOnDistinctNodes(t, cc, s, "s", 2))
		a, b := keys[0], keys[1]
		// An hour's lease, run out by ageing its record (see age): the
		// record is kept for most of another hour, however slow the test.
		const lease = time.Hour
		c1, err := s.Claim(ctx, "s", []string{a}, lease)
		if err != nil || c1.Result != stores.Claimed {
			t.Fatal(c1, err)
		}
		if c, err := s.Claim(ctx, "s", []string{b}, time.Hour); err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		age(t, side, lease+50*time.Millisecond, rks[0]) // c1's lease ran out; its record is kept a while longer
		before := pttl(a)
		if before <= 0 || before >= lease {
			t.Fatalf("the expired lease's record has a PTTL of %s, want one below the lease (%s)", before, lease)
		}
		tap.mu.Lock()
		tap.delay[rks[1]] = 300 * time.Millisecond // B's node answers late
		tap.mu.Unlock()
		c, err := s.Claim(ctx, "s", []string{a, b}, time.Minute)
		if err != nil || c.Result != stores.InProgress {
			t.Fatalf("Claim(A, B) = %+v, %v; want InProgress (B is held)", c, err)
		}
		if after := pttl(a); after > before {
			t.Fatalf("A was put back with a TTL of %s, longer than the %s it had before the claim", after, before)
		}
	})

	// claimApart claims two keys of distinct nodes for a minute.
	claimApart := func(t *testing.T) ([]string, *stores.Claim) {
		t.Helper()
		keys := keysOnDistinctNodes(t, cc, s, "s", 2)
		c, err := s.Claim(ctx, "s", keys, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		return keys, c
	}

	// A key forgotten between the check and its apply fails the call with
	// ErrLostClaim, whichever key it is, and the keys applied are put back
	// (a record of a one-minute lease lives two minutes, an hour-long one
	// two hours).
	t.Run("FirstKeyLostBeforeItsApply", func(t *testing.T) {
		keys, c := claimApart(t)
		first := s.EncodeKey("s", keys[0])
		var once sync.Once
		tap.setPipe(t, func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
			for _, cmd := range cmds {
				if isScriptOn(cmd, first) {
					once.Do(func() {
						if err := side.Del(ctx, first).Err(); err != nil {
							t.Error(err)
						}
					})
				}
			}
			return send()
		})
		err := s.Extend(ctx, c, time.Hour)
		if !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Extend with its first key forgotten = %v, want ErrLostClaim", err)
		}
		if msg := err.Error(); !strings.Contains(msg, keys[0]) || strings.Contains(msg, keys[1]) {
			t.Fatalf("Extend error %q should name the lost key %q only", msg, keys[0])
		}
		if d := pttl(keys[1]); d > 2*time.Minute {
			t.Fatalf("the Extend failed, yet the second key is now leased for %s", d)
		}
	})

	// An apply whose reply is lost (the connection fails after the node
	// ran it) fails the call, and what it may have applied is put back.
	t.Run("ApplyWithLostReply", func(t *testing.T) {
		keys, c := claimApart(t)
		second := s.EncodeKey("s", keys[1])
		var once sync.Once
		tap.setPipe(t, func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
			err := send()
			for _, cmd := range cmds {
				if isScriptOn(cmd, second) {
					once.Do(func() { cmd.SetErr(errors.New("connection reset by peer (simulated)")) })
				}
			}
			return err
		})
		if err := s.Extend(ctx, c, time.Hour); err == nil {
			t.Fatal("Extend whose reply for a key was lost returned nil")
		}
		for _, k := range keys {
			if d := pttl(k); d > 2*time.Minute {
				t.Fatalf("the Extend failed, yet key %q is now leased for %s", k, d)
			}
		}
	})
}

// undoHook holds every pipeline that carries a script call on key until
// release is closed, whatever its context: a node that takes as long as
// the test likes to answer, on one key (its hold is the client's
// redistest.RedisTap).
type undoHook struct {
	key     string
	entered chan struct{} // closed when the first such pipeline is held
	once    sync.Once
	release chan struct{}
}

// arm makes h hold the next pipeline again, and returns what lets it
// go: a func that closes release once, called when t ends if not before.
func (h *undoHook) arm(t *testing.T) (release func()) {
	h.entered, h.once, h.release = make(chan struct{}), sync.Once{}, make(chan struct{})
	return closer(t, h.release)
}

func (h *undoHook) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); (n == "evalsha" || n == "eval") && cmdKey(c) == h.key {
			h.once.Do(func() { close(h.entered) })
			<-h.release
			return
		}
	}
}

// testUndoNeverHoldsTheCaller: a multi-key claim over two nodes that
// takes its first key and finds the second held gives the first back;
// the caller does not wait for that past its deadline, however long the
// node takes to answer (here: until the test lets it), and the key is
// free once it has.
func testUndoNeverHoldsTheCaller(t *testing.T, addrs []string) {
	undoRuns(t, addrs, func(h *undoHook, cc *redis.ClusterClient, s *redisstore.Store, batch redisstore.BatchConfig, release func()) {
		keys := ascendingOnNodes(t, cc, s, "h", 2)
		first, second := keys[0], keys[1] // claimed in this order
		if _, err := s.Claim(context.Background(), "h", []string{second}, time.Minute); err != nil {
			t.Fatal(err)
		}
		h.key = s.EncodeKey("h", first)

		ctx, cancel := context.WithCancel(context.Background())
		done := claimAsync(ctx, s, "h", first, second)
		<-h.entered // the first key is being given back, held by its node
		cancel()
		select {
		case a := <-done:
			if a.err == nil && a.c.Result != stores.InProgress || a.err != nil && !errors.Is(a.err, context.Canceled) {
				t.Errorf("Claim(%q, %q), the second held = %v, %v; want in progress, or the context's error", first, second, a.c, a.err)
			}
		case <-time.After(time.Minute): // only a caller held by the undo waits this long
			t.Fatalf("Claim(%q, %q) has not returned a minute after its context ended: its undo holds it (batch %+v)", first, second, batch)
		}
		release()
		testkit.WaitFor(t, time.Minute, "the first key given back", func() bool {
			c, err := s.Claim(context.Background(), "h", []string{first}, time.Minute)
			return err == nil && c.Result == stores.Claimed
		})
	})
}

// testUndoWaitsForNoOtherNode: a multi-key claim over three nodes that
// takes its first two keys and finds the third held gives the two back,
// each on its node; a node that takes as long as the test likes to answer
// (here: until the test lets it) holds up the give-back of its own key
// only. The other key is given back while that node still holds its
// own, also when its node must be sent the script again (NOSCRIPT: it
// has not cached it, as after a failover or a restart).
func testUndoWaitsForNoOtherNode(t *testing.T, addrs []string) {
	ctx := context.Background()
	undoRuns(t, addrs, func(h *undoHook, cc *redis.ClusterClient, s *redisstore.Store, _ redisstore.BatchConfig, release func()) {
		keys := ascendingOnNodes(t, cc, s, "h", 3)
		// The third key is held: the claim gives back the first two.
		if _, err := s.Claim(ctx, "h", keys[2:], time.Minute); err != nil {
			t.Fatal(err)
		}
		h.key = s.EncodeKey("h", keys[1]) // its node holds its give-back
		first, err := cc.MasterForKey(ctx, s.EncodeKey("h", keys[0]))
		if err != nil {
			t.Fatal(err)
		}
		if err := first.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The caller (no deadline) waits for its give-backs, the held
		// one too.
		done := claimAsync(ctx, s, "h", keys...)
		select {
		case <-h.entered: // the second key's give-back, held by its node
		case a := <-done:
			t.Fatalf("Claim(%q), the third held = %v, %v before the second key's give-back went out", keys, a.c, a.err)
		}
		testkit.WaitFor(t, time.Minute, "the first key given back while the second key's node holds its own give-back", func() bool {
			n, err := first.Exists(ctx, s.EncodeKey("h", keys[0])).Result()
			return err == nil && n == 0
		})
		release()
		if a := <-done; a.err != nil || a.c.Result != stores.InProgress {
			t.Fatalf("Claim(%q), the third held = %v, %v; want in progress", keys, a.c, a.err)
		}
		testkit.WaitFor(t, time.Minute, "the second key given back", func() bool {
			c, err := s.Claim(ctx, "h", keys[1:2], time.Minute)
			return err == nil && c.Result == stores.Claimed
		})
	})
}

// undoRuns runs run with batching on, then off, each time on a store of
// its own (closed after run) on a cluster client of addrs with h, the
// undo hook, armed: release lets it go.
func undoRuns(t *testing.T, addrs []string, run func(h *undoHook, cc *redis.ClusterClient, s *redisstore.Store, batch redisstore.BatchConfig, release func())) {
	t.Helper()
	h := &undoHook{}
	cc := hookedCluster(t, addrs, redistest.RedisTap(h.hold))
	for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
		release := h.arm(t)
		s, err := redisstore.New(cc, redisstore.Config{Prefix: testPrefix(t, cc), SkipServerCheck: true, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		run(h, cc, s, batch, release)
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// ascendingOnNodes returns n keys whose records in scope are on n
// different nodes, in ascending order of their Redis keys.
func ascendingOnNodes(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, scope string, n int) []string {
	t.Helper()
	ctx := context.Background()
	node := func(k string) string {
		c, err := cc.MasterForKey(ctx, s.EncodeKey(scope, k))
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	for range 10000 {
		// Ids of their own: CRC16 is linear, so keys that differ in one
		// byte are a fixed number of slots apart.
		keys, nodes := make([]string, n), map[string]bool{}
		for i := range keys {
			keys[i] = string(rune('a'+i)) + "-" + storetest.NewID()
			nodes[node(keys[i])] = true
		}
		if len(nodes) == n {
			return keys
		}
	}
	t.Fatalf("no %d keys on %d nodes", n, n)
	return nil
}

// hookedCluster returns a cluster client on addrs with hook on every
// node; it is closed when t ends.
func hookedCluster(t *testing.T, addrs []string, hook redis.Hook) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	cc.OnNewNode(func(c *redis.Client) { c.AddHook(hook) })
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// closer returns a func that closes ch on its first call and does
// nothing on the next ones; t calls it when it ends.
func closer(t *testing.T, ch chan struct{}) func() {
	var once sync.Once
	f := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(f)
	return f
}
