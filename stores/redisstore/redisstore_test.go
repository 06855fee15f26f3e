package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// sharedRedis returns a client for the shared Redis (REDIS_ADDR or
// 127.0.0.1:6379); when none answers, the test fails naming it (see
// testkit.Unavailable).
func sharedRedis(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, testkit.RequireRedis(t))
}

func TestConformance(t *testing.T) {
	c := sharedRedis(t)
	storetest.Run(t, factory(c, redisstore.Config{}), serverTime(c))
}

// TestConformanceDigest runs the suite with every key longer than 16 bytes
// stored as a digest: the suite's keys are all longer.
func TestConformanceDigest(t *testing.T) {
	if testing.Short() {
		t.Skip("the digest layout is also covered by TestBadInput")
	}
	c := sharedRedis(t)
	storetest.Run(t, factory(c, redisstore.Config{DigestKeysLongerThan: 16}), serverTime(c), storetest.AdminNoKeys())
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []redisstore.Config{
		{MaxKeyLen: -1},
		{DigestKeysLongerThan: -1},
		{DigestKeysLongerThan: 15},
		{CompactKeys: true, DigestKeysLongerThan: 16},
		// Keys of 1025 to 2048 bytes refused, longer ones digested: no
		// Capabilities.MaxKey says that.
		{DigestKeysLongerThan: 2048},
		{MaxKeyLen: 100, DigestKeysLongerThan: 101},
		{MaxData: -1},
		{Batch: redisstore.BatchConfig{MaxBatch: -1}},
		{Batch: redisstore.BatchConfig{MaxBatch: 10001}},
		{Batch: redisstore.BatchConfig{MaxInFlight: -1}},
		{Batch: redisstore.BatchConfig{MaxInFlight: 1025}},
	} {
		err := cfg.Validate()
		if err == nil {
			t.Errorf("Validate(%+v) accepted an invalid config", cfg)
			continue
		}
		if _, err := redisstore.New(redis.NewClient(&redis.Options{}), cfg); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
	if err := (redisstore.Config{}).Validate(); err != nil {
		t.Errorf("the zero Config is invalid: %v", err)
	}
	// The largest batch and slot counts allowed are valid.
	if err := (redisstore.Config{Batch: redisstore.BatchConfig{MaxBatch: 10000, MaxInFlight: 1024}}).Validate(); err != nil {
		t.Errorf("MaxBatch 10000 and MaxInFlight 1024 refused: %v", err)
	}
	if _, err := redisstore.New(nil, redisstore.Config{}); err == nil {
		t.Error("New accepted a nil client")
	}
}

// TestLayout pins what a record looks like in Redis: the key bytes, the
// value and the TTLs the README documents.
func TestLayout(t *testing.T) {
	ctx := context.Background()
	c := sharedRedis(t)
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Config{Prefix: prefix})

	const id = "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"
	uuid16 := "\x0b\x9e\x5c\x3a\x7f\x0d\x4c\x1e\x9a\x55\x1d\x2f\x3e\x4a\x5b\x6c"
	for _, tc := range []struct{ scope, key, want string }{
		{"orders", id, prefix + "orders=" + uuid16},
		{"orders", "msg:" + id, prefix + "orders=msg:" + uuid16},
		{"orders", "pay-42", prefix + "orders:pay-42"},
		{"a:b{c}", "x{y}%", prefix + "a%3Ab%7Bc}:x%7By}%25"},
		{"s=#", strings.ToUpper(id), prefix + "s%3D%23:" + strings.ToUpper(id)},
		{"", "k", prefix + ":k"},
	} {
		if got := s.EncodeKey(tc.scope, tc.key); got != tc.want {
			t.Errorf("EncodeKey(%q, %q) = %q, want %q", tc.scope, tc.key, got, tc.want)
		}
	}

	lease, retention := 30*time.Second, time.Hour
	cl, err := s.Claim(ctx, "orders", []string{id}, lease)
	if err != nil || cl.Result != stores.Claimed {
		t.Fatalf("Claim = %v, %v", cl, err)
	}
	rk := prefix + "orders=" + uuid16
	v := c.Get(ctx, rk).Val()
	if want := "p" + cl.Token + "30000"; v != want || len(cl.Token) != redisstore.TokenLen {
		t.Errorf("processing value = %q, want %q", v, want)
	}
	if pttl := c.PTTL(ctx, rk).Val(); pttl <= 2*lease-time.Second || pttl > 2*lease {
		t.Errorf("processing PTTL = %s, want 2×lease = %s", pttl, 2*lease)
	}
	if err := s.Complete(ctx, cl, retention, nil); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, rk).Val(); v != "1" {
		t.Errorf("done value = %q, want %q", v, "1")
	}
	// "1" is stored as one of Redis's shared integers: no allocation.
	if enc := c.ObjectEncoding(ctx, rk).Val(); enc != "int" {
		t.Errorf("done value encoding = %q, want int", enc)
	}
	if pttl := c.PTTL(ctx, rk).Val(); pttl <= retention-time.Second || pttl > retention {
		t.Errorf("done PTTL = %s, want retention = %s", pttl, retention)
	}

	cl, _ = s.Claim(ctx, "orders", []string{"with-data"}, lease)
	if err := s.Complete(ctx, cl, retention, []byte{0, 'x'}); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, prefix+"orders:with-data").Val(); v != "d\x00x" {
		t.Errorf("done value with data = %q, want %q", v, "d\x00x")
	}
}

// TestBadInput covers the inputs the issue lists: empty, binary and 1 MiB
// keys, and scopes holding ':' or '{'.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	c := sharedRedis(t)
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Config{Prefix: prefix})
	const lease = 10 * time.Second

	huge := strings.Repeat("k", 1<<20)
	_, err := s.Claim(ctx, "scope", []string{"ok", huge}, lease)
	if !errors.Is(err, stores.ErrInvalidKey) {
		t.Fatalf("Claim of a 1 MiB key: %v, want ErrInvalidKey", err)
	}
	_, err = s.Claim(ctx, strings.Repeat("s", redisstore.DefaultMaxKeyLen+1), []string{"ok"}, lease)
	if !errors.Is(err, stores.ErrInvalidArgument) {
		t.Fatalf("Claim with a scope over MaxKeyLen: %v, want ErrInvalidArgument", err)
	}
	_, err = s.Claim(ctx, "scope", []string{""}, lease)
	if !errors.Is(err, stores.ErrInvalidKey) {
		t.Fatalf("Claim of an empty key: %v, want ErrInvalidKey", err)
	}
	if n := countPrefix(t, c, prefix); n != 0 {
		t.Fatalf("rejected claims wrote %d keys", n)
	}

	// With digests on, the 1 MiB key is stored as 16 bytes, and a key one
	// byte different is a different record.
	ds := newStore(t, c, redisstore.Config{Prefix: prefix + "d:", DigestKeysLongerThan: 64})
	rk := ds.EncodeKey("scope", huge)
	if want := len(prefix+"d:") + len("scope#") + 16; len(rk) != want {
		t.Fatalf("digested key is %d bytes, want %d", len(rk), want)
	}
	c1, err := ds.Claim(ctx, "scope", []string{huge}, lease)
	if err != nil || c1.Result != stores.Claimed {
		t.Fatalf("Claim of a digested 1 MiB key = %v, %v", c1, err)
	}
	c2, err := ds.Claim(ctx, "scope", []string{huge[1:] + "j"}, lease)
	if err != nil || c2.Result != stores.Claimed {
		t.Fatalf("Claim of another 1 MiB key = %v, %v", c2, err)
	}
	if err := ds.Complete(ctx, c1, time.Minute, []byte("huge")); err != nil {
		t.Fatal(err)
	}
	if d, _ := ds.Claim(ctx, "scope", []string{huge}, lease); d.Result != stores.Duplicate || string(d.Data) != "huge" {
		t.Fatalf("second Claim of the digested key = %v", d)
	}

	// Scopes and keys with ':', '{', '}' and binary bytes never open a
	// Redis Cluster hash tag, and never collide (storetest's NoCollisions
	// covers the latter for many more pairs).
	for _, sc := range []string{"a:b", "a{b}", "{", "}{", "\x00\xff"} {
		for _, k := range []string{"{x}", "\x00{\xff}", "k:{"} {
			rk := s.EncodeKey(sc, k)
			if strings.ContainsRune(rk, '{') {
				t.Errorf("EncodeKey(%q, %q) = %q holds a '{'", sc, k, rk)
			}
			cl, err := s.Claim(ctx, sc, []string{k}, lease)
			if err != nil || cl.Result != stores.Claimed {
				t.Fatalf("Claim(%q, %q) = %v, %v", sc, k, cl, err)
			}
		}
	}
}

// TestLeaseExpiry: a claimant that heartbeats keeps its claim past its
// lease; once it stops, it is taken over after its lease, and its late
// Complete fails with ErrLostClaim and changes nothing.
func TestLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	c := sharedRedis(t)
	a := newStore(t, c, redisstore.Config{})
	b := newStore(t, c, redisstore.Config{Prefix: aPrefix(t, a)})
	// An hour's lease: time passes for the records only when the test
	// ages them (see age), never because the machine was slow.
	const lease = time.Hour
	keys := []string{"order-1", "pay-1"}
	rkeys := []string{a.EncodeKey("h", keys[0]), a.EncodeKey("h", keys[1])}

	ca, err := a.Claim(ctx, "h", keys, lease)
	if err != nil || ca.Result != stores.Claimed {
		t.Fatalf("Claim = %v, %v", ca, err)
	}
	// Heartbeat for three leases; b sees the claim held throughout.
	for range 6 {
		age(t, c, lease/2, rkeys...)
		if err := a.Extend(ctx, ca, lease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if cb, err := b.Claim(ctx, "h", keys[1:], lease); err != nil || cb.Result != stores.InProgress {
			t.Fatalf("Claim while heartbeating = %v, %v; want in_progress", cb, err)
		}
	}
	// a stops heartbeating (it hangs, or crashed after its side effect).
	age(t, c, lease+lease/4, rkeys...)
	cb, err := b.Claim(ctx, "h", keys, lease)
	if err != nil || cb.Result != stores.Claimed || !cb.Takeover {
		t.Fatalf("Claim after the lease = %+v, %v; want a claimed takeover", cb, err)
	}
	if err := a.Complete(ctx, ca, time.Minute, []byte("late")); !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("late Complete: %v, want ErrLostClaim", err)
	}
	if err := a.Extend(ctx, ca, lease); !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("late Extend: %v, want ErrLostClaim", err)
	}
	if err := b.Complete(ctx, cb, time.Minute, []byte("b")); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		d, err := a.Claim(ctx, "h", []string{k}, lease)
		if err != nil || d.Result != stores.Duplicate || string(d.Data) != "b" {
			t.Fatalf("Claim(%q) after takeover = %+v, %v; want duplicate with b's data", k, d, err)
		}
	}
}

// aPrefix returns the prefix store s writes under, read back from a key.
func aPrefix(t *testing.T, s *redisstore.Store) string {
	t.Helper()
	k := s.EncodeKey("", "x")
	return strings.TrimSuffix(k, ":x")
}

// TestFailedMultiKeyClaimKeepsTakeoverCandidate: a multi-key claim that
// fails on one key must leave an expired lease on another key as it was,
// so its late owner can still complete it.
func TestFailedMultiKeyClaimKeepsExpiredLease(t *testing.T) {
	c := sharedRedis(t)
	testFailedMultiKeyClaimKeepsExpiredLease(t, c, newStore(t, c, redisstore.Config{}))
}

// testFailedMultiKeyClaimKeepsExpiredLease runs on s, a store on client.
func testFailedMultiKeyClaimKeepsExpiredLease(t *testing.T, client redis.UniversalClient, s *redisstore.Store) {
	ctx := context.Background()
	// An hour's lease, run out by ageing the record (see age): its
	// record is kept for most of another hour, however slow the test.
	const lease = time.Hour
	old, err := s.Claim(ctx, "h", []string{"a"}, lease)
	if err != nil || old.Result != stores.Claimed {
		t.Fatalf("Claim(a) = %v, %v", old, err)
	}
	held, err := s.Claim(ctx, "h", []string{"b"}, time.Minute)
	if err != nil || held.Result != stores.Claimed {
		t.Fatalf("Claim(b) = %v, %v", held, err)
	}
	age(t, client, lease+lease/4, s.EncodeKey("h", "a")) // a's lease is over, b's is not
	for _, keys := range [][]string{{"a", "b"}, {"b", "a"}} {
		cl, err := s.Claim(ctx, "h", keys, lease)
		if err != nil || cl.Result != stores.InProgress {
			t.Fatalf("Claim(%q) = %+v, %v; want in_progress", keys, cl, err)
		}
	}
	// a is untouched: its owner completes it.
	if err := s.Complete(ctx, old, time.Minute, []byte("a")); err != nil {
		t.Fatalf("Complete of the expired but untaken lease: %v", err)
	}
	if err := s.Complete(ctx, held, time.Minute, []byte("b")); err != nil {
		t.Fatal(err)
	}
	d, err := s.Claim(ctx, "h", []string{"c", "b", "a"}, lease)
	if err != nil || d.Result != stores.Duplicate || string(d.Data) != "b" {
		t.Fatalf("Claim(c, b, a) = %+v, %v; want duplicate with b's data", d, err)
	}
	if cl, _ := s.Claim(ctx, "h", []string{"c"}, lease); cl.Result != stores.Claimed {
		t.Fatalf("c was left claimed by a failed claim: %s", cl.Result)
	}
}

// TestRetriedClaimGetsItsClaimBack: go-redis retries a command whose reply
// was lost; the retry of a Claim that did run finds its own token and must
// not answer InProgress to itself.
func TestRetriedClaimGetsItsClaimBack(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, sharedRedis(t), redisstore.Config{})
	token := strings.Repeat("T", redisstore.TokenLen)
	for i := range 2 {
		r, err := s.ClaimWithToken(ctx, "h", []string{"a", "b"}, time.Minute, token)
		if err != nil || r != 1 {
			t.Fatalf("attempt %d: result %d, %v; want claimed", i, r, err)
		}
	}
	r, err := s.ClaimWithToken(ctx, "h", []string{"b"}, time.Minute, strings.Repeat("U", redisstore.TokenLen))
	if err != nil || r != 3 {
		t.Fatalf("another token: result %d, %v; want in progress", r, err)
	}
}

// TestStoreOutage cuts a TCP proxy between the store and Redis: calls fail
// promptly instead of hanging, and the store works again after Restore.
func TestStoreOutage(t *testing.T) {
	addr := testkit.RequireRedis(t)
	proxy, viaProxy := proxiedClient(t, addr, redis.Options{DialTimeout: time.Second})
	direct := newClient(t, addr)
	prefix := testPrefix(t, direct)
	s := newStore(t, viaProxy, redisstore.Config{Prefix: prefix})
	// An hour: the claim held across the cut must still be there to
	// complete after it, however long a loaded machine takes.
	const lease = time.Hour

	// During the cut go-redis retries until the caller's deadline: a call
	// must fail by then, not hang on a dead connection.
	const deadline = 500 * time.Millisecond
	call := func(keys ...string) (*stores.Claim, error) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		return s.Claim(ctx, "h", keys, lease)
	}
	held, err := call("before")
	if err != nil || held.Result != stores.Claimed {
		t.Fatalf("Claim before the cut = %v, %v", held, err)
	}

	// Each call must give up by itself while the cut lasts (the proxy is
	// restored only after them), however slowly a loaded machine runs it.
	proxy.Cut()
	for _, k := range []string{"during-1", "during-2", "during-3"} {
		err := testkit.ReturnsDuringOutage(t, fmt.Sprintf("Claim(%q) during the cut", k), func() error { _, err := call(k); return err })
		if err == nil {
			t.Fatalf("Claim(%q) during the cut succeeded", k)
		}
	}
	err = testkit.ReturnsDuringOutage(t, "Complete during the cut", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		return s.Complete(ctx, held, time.Minute, nil)
	})
	if err == nil || errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("Complete during the cut: %v, want a connection error", err)
	}
	// Nothing reached Redis.
	if n := countPrefix(t, direct, prefix); n != 1 {
		t.Fatalf("%d records under the prefix after the cut, want 1", n)
	}

	proxy.Restore()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Complete(ctx, held, time.Minute, []byte("ok")); err != nil {
		t.Fatalf("Complete after Restore: %v", err)
	}
	cl, err := s.Claim(ctx, "h", []string{"during-1"}, lease)
	if err != nil || cl.Result != stores.Claimed {
		t.Fatalf("Claim after Restore = %v, %v", cl, err)
	}
	if d, err := s.Claim(ctx, "h", []string{"before"}, lease); err != nil || d.Result != stores.Duplicate || string(d.Data) != "ok" {
		t.Fatalf("Claim of the completed key after Restore = %v, %v", d, err)
	}
}

// TestCloseLeavesClientOpen: Close never closes the caller's client, and
// stops everything the store started.
func TestCloseLeavesClientOpen(t *testing.T) {
	addr := testkit.RequireRedis(t)
	prefix := testPrefix(t, newClient(t, addr))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := redis.NewClient(&redis.Options{Addr: addr})
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("client after store Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestClientKinds: the store works with whatever UniversalClient it gets;
// only a plain *redis.Client runs multi-key scripts, others go key by key.
func TestClientKinds(t *testing.T) {
	addr := testkit.RequireRedis(t)
	direct := newClient(t, addr)
	universal := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr, "b": addr}})
	t.Cleanup(func() { _ = universal.Close(); _ = ring.Close() })
	for _, tc := range []struct {
		name    string
		client  redis.UniversalClient
		sharded bool
	}{{"universal", universal, false}, {"ring", ring, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := newStore(t, tc.client, redisstore.Config{Prefix: testPrefix(t, direct)})
			if s.Sharded() != tc.sharded {
				t.Fatalf("Sharded() = %v, want %v", s.Sharded(), tc.sharded)
			}
			cl, err := s.Claim(ctx, "h", []string{"a", "b", "c"}, time.Minute)
			if err != nil || cl.Result != stores.Claimed {
				t.Fatalf("Claim = %v, %v", cl, err)
			}
			if r, _ := s.Claim(ctx, "h", []string{"d", "c"}, time.Minute); r.Result != stores.InProgress {
				t.Fatalf("Claim(d, c) = %s", r.Result)
			}
			if err := s.Complete(ctx, cl, time.Minute, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if r, _ := s.Claim(ctx, "h", []string{"d", "b"}, time.Minute); r.Result != stores.Duplicate || string(r.Data) != "x" {
				t.Fatalf("Claim(d, b) = %+v", r)
			}
			if err := s.CheckServer(ctx); err != nil {
				t.Fatalf("CheckServer: %v", err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.CheckServer(ctx); !errors.Is(err, stores.ErrClosed) {
				t.Fatalf("CheckServer after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestCheckServer checks the maxmemory-policy warning against servers of
// the test's own: the shared Redis must not be reconfigured.
func TestCheckServer(t *testing.T) {
	ctx := context.Background()

	t.Run("noeviction", func(t *testing.T) {
		log := watermill.NewCaptureLogger()
		s := newStore(t, sharedRedis(t), redisstore.Config{Logger: log})
		if err := s.CheckServer(ctx); err != nil {
			t.Fatalf("CheckServer: %v", err)
		}
		if n := len(log.Captured()[watermill.ErrorLogLevel]); n != 0 {
			t.Fatalf("%d errors logged for a noeviction server", n)
		}
	})

	t.Run("evicting", func(t *testing.T) {
		addr := startRedis(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
		log := &signalLogger{CaptureLoggerAdapter: watermill.NewCaptureLogger(), errored: make(chan struct{}, 1)}
		// New checks in the background and logs what it finds.
		s, err := redisstore.New(newClient(t, addr), redisstore.Config{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-log.errored:
		case <-time.After(10 * time.Second):
			t.Fatal("New's background check logged no error")
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		logged := log.Captured()[watermill.ErrorLogLevel]
		if len(logged) != 1 || !errors.Is(logged[0].Err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("New logged %v, want one error wrapping ErrEvictionPolicy", logged)
		}
		s = newStore(t, newClient(t, addr), redisstore.Config{Logger: log})
		if err := s.CheckServer(ctx); !errors.Is(err, redisstore.ErrEvictionPolicy) || !strings.Contains(err.Error(), "volatile-lru") {
			t.Fatalf("CheckServer: %v, want ErrEvictionPolicy naming volatile-lru", err)
		}
	})

	t.Run("CONFIG disabled", func(t *testing.T) {
		addr := startRedis(t, "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "")
		log := watermill.NewCaptureLogger()
		s := newStore(t, newClient(t, addr), redisstore.Config{Logger: log})
		if err := s.CheckServer(ctx); err != nil {
			t.Fatalf("CheckServer with CONFIG disabled: %v, want nil", err)
		}
		infos := log.Captured()[watermill.InfoLogLevel]
		if len(infos) != 1 || !strings.Contains(infos[0].Msg, "noeviction") {
			t.Fatalf("want one info telling to check noeviction, got %v", infos)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		s := newStore(t, c, redisstore.Config{Prefix: "unused:"})
		if err := s.CheckServer(ctx); err == nil || errors.Is(err, redisstore.ErrEvictionPolicy) {
			t.Fatalf("CheckServer of an unreachable server: %v, want a connection error", err)
		}
	})
}

// signalLogger is a capture logger that signals its first Error.
type signalLogger struct {
	*watermill.CaptureLoggerAdapter
	errored chan struct{}
}

func (l *signalLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.CaptureLoggerAdapter.Error(msg, err, fields)
	select {
	case l.errored <- struct{}{}:
	default:
	}
}

// TestDataIsCopied: the Data of a Duplicate does not alias the caller's
// buffer handed to Complete.
func TestDataIsCopied(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, sharedRedis(t), redisstore.Config{})
	buf := []byte("original")
	cl, _ := s.Claim(ctx, "h", []string{"k"}, time.Minute)
	if err := s.Complete(ctx, cl, time.Minute, buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "CHANGED!")
	d, _ := s.Claim(ctx, "h", []string{"k"}, time.Minute)
	if !bytes.Equal(d.Data, []byte("original")) {
		t.Fatalf("Data = %q", d.Data)
	}
}

// TestRouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on a redisstore whose connection goes through a TCP proxy the
// test owns, cut in the middle of a stream of messages and duplicate
// deliveries and restored later: fail-closed nacks during the cut and
// never runs the handler for a message it could not claim; after the
// restore every message is applied exactly once and every delivery acked
// (see testkit.RouterOutage).
func TestRouterOutage(t *testing.T) {
	addr := testkit.RequireRedis(t)
	proxy, viaProxy := proxiedClient(t, addr, redis.Options{DialTimeout: 500 * time.Millisecond})
	direct := newClient(t, addr)
	store := newStore(t, viaProxy, redisstore.Config{Prefix: testPrefix(t, direct)})
	testkit.RouterOutage(t, store, proxy.Cut, proxy.Restore)
}

// waitFor polls cond until it holds or timeout passes.
var waitFor = testkit.WaitFor

// modelOptions describe a store with cfg to storetest.RunModel: Redis
// keeps time on the server, to the millisecond, and the store bounds
// scopes, and keys unless CompactKeys, to MaxKeyLen.
func modelOptions(cfg redisstore.Config) []storetest.Option {
	opts := []storetest.Option{
		storetest.RealTime(unit),
		storetest.Precision(time.Millisecond),
		storetest.MaxScopeLen(redisstore.DefaultMaxKeyLen),
	}
	if !cfg.CompactKeys {
		opts = append(opts, storetest.MaxKeyLen(redisstore.DefaultMaxKeyLen))
	}
	return opts
}

// runModels runs the model on client for each config, in parallel: the
// model mostly sleeps, to let real time pass.
func runModels(t *testing.T, client redis.UniversalClient, cfgs map[string]redisstore.Config) {
	for name, cfg := range cfgs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.RunModel(t, factory(client, cfg), modelOptions(cfg)...)
		})
	}
}

// TestModel checks the store against the model of the Store contract on
// the shared Redis, batched and unbatched, and with CompactKeys.
func TestModel(t *testing.T) {
	c := sharedRedis(t)
	runModels(t, c, map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
		"Compact":   {CompactKeys: true},
	})
}

// TestModelCluster checks the store against the model in a Redis Cluster
// of three masters it starts (see startCluster), where the keys of a
// claim live on different nodes.
func TestModelCluster(t *testing.T) {
	cc := startCluster(t)
	runModels(t, cc, map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
	})
}

// TestRESP2 runs the conformance suite and the model of the Store
// contract over RESP2 (Redis before 6, many proxies, clients pinned to
// it), whose replies to the scripts and to SET ... GET decode differently
// from RESP3's. RESP3, go-redis v9's default, is what every other test of
// this package speaks.
func TestRESP2(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testkit.RequireRedis(t), Protocol: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for name, cfg := range map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
	} {
		t.Run(name, func(t *testing.T) {
			// Not in parallel: the model already runs four sequences at
			// once.
			storetest.Run(t, factory(c, cfg), serverTime(c))
			storetest.RunModel(t, factory(c, cfg), modelOptions(cfg)...)
		})
	}
}
