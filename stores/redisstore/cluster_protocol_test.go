package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

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

	// A key forgotten between the check and its apply fails the call with
	// ErrLostClaim, whichever key it is, and the keys applied are put back
	// (a record of a one-minute lease lives two minutes, an hour-long one
	// two hours).
	t.Run("FirstKeyLostBeforeItsApply", func(t *testing.T) {
		keys := keysOnDistinctNodes(t, cc, s, "s", 2)
		c, err := s.Claim(ctx, "s", keys, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		first := s.EncodeKey("s", keys[0])
		var once sync.Once
		tap.mu.Lock()
		tap.pipe = func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
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
		}
		tap.mu.Unlock()
		defer func() { tap.mu.Lock(); tap.pipe = nil; tap.mu.Unlock() }()
		err = s.Extend(ctx, c, time.Hour)
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
		keys := keysOnDistinctNodes(t, cc, s, "s", 2)
		c, err := s.Claim(ctx, "s", keys, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		second := s.EncodeKey("s", keys[1])
		var once sync.Once
		tap.mu.Lock()
		tap.pipe = func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
			err := send()
			for _, cmd := range cmds {
				if isScriptOn(cmd, second) {
					once.Do(func() { cmd.SetErr(errors.New("connection reset by peer (simulated)")) })
				}
			}
			return err
		}
		tap.mu.Unlock()
		defer func() { tap.mu.Lock(); tap.pipe = nil; tap.mu.Unlock() }()
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
