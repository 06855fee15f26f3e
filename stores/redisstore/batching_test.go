package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/base"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestConformanceUnbatched runs the suite with batching off (TestConformance
// runs it with the default: on).
func TestConformanceUnbatched(t *testing.T) {
	c := sharedRedis(t)
	storetest.Run(t, factory(c, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}}), serverTime(c))
}

// TestConformanceCompact runs the suite with compact keys.
func TestConformanceCompact(t *testing.T) {
	c := sharedRedis(t)
	storetest.Run(t, factory(c, redisstore.Config{CompactKeys: true}), serverTime(c), storetest.AdminNoScopes())
}

// cmdHook is a go-redis hook that sees the store's commands: those whose
// first key starts with prefix. It counts them, sent alone or in a
// pipeline, and lets a test hold a command back (gate).
type cmdHook struct {
	prefix string
	// gate, when set, is called before the commands go out (one, or the
	// store's commands of a pipeline); it may block.
	gate func(keys []string)

	mu        sync.Mutex
	singles   int   // commands sent alone
	pipelines []int // store commands in each pipeline
}

func newCmdHook(prefix string) *cmdHook { return &cmdHook{prefix: prefix} }

// cmdKey returns the first key of a store command: SET key …, EVALSHA sha n
// key …, EVAL script n key ….
func cmdKey(cmd redis.Cmder) string {
	args := cmd.Args()
	name, _ := args[0].(string)
	i := 1
	if strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval") {
		i = 3
	}
	if len(args) <= i {
		return ""
	}
	k, _ := args[i].(string)
	return k
}

func (h *cmdHook) mine(cmds []redis.Cmder) []string {
	var keys []string
	for _, c := range cmds {
		if k := cmdKey(c); strings.HasPrefix(k, h.prefix) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (h *cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if keys := h.mine([]redis.Cmder{cmd}); len(keys) > 0 {
			h.mu.Lock()
			h.singles++
			gate := h.gate
			h.mu.Unlock()
			if gate != nil {
				gate(keys)
			}
		}
		return next(ctx, cmd)
	}
}

func (h *cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if keys := h.mine(cmds); len(keys) > 0 {
			h.mu.Lock()
			h.pipelines = append(h.pipelines, len(keys))
			gate := h.gate
			h.mu.Unlock()
			if gate != nil {
				gate(keys)
			}
		}
		return next(ctx, cmds)
	}
}

// counts returns the commands sent alone, the pipelines, the commands in
// them, and the largest.
func (h *cmdHook) counts() (singles, pipelines, pipelined, largest int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.pipelines {
		pipelined += n
		largest = max(largest, n)
	}
	return h.singles, len(h.pipelines), pipelined, largest
}

func (h *cmdHook) setGate(gate func(keys []string)) {
	h.mu.Lock()
	h.gate = gate
	h.mu.Unlock()
}

// holdKey makes the hook hold back every command batch holding the
// record of key (of scope "h") until release is closed; held is closed
// when the first one arrives. It replaces the hook's gate: a batch the
// gate already holds stays held.
func holdKey(s *redisstore.Store, h *cmdHook, key string) (held, release chan struct{}) {
	rk := s.EncodeKey("h", key)
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.setGate(func(keys []string) {
		for _, k := range keys {
			if k == rk {
				once.Do(func() { close(held) })
				<-release
				return
			}
		}
	})
	return held, release
}

// hookedStore returns a store under a fresh prefix on client, and a hook
// on client watching that prefix. Hooks cannot be removed from a client;
// one watching another test's prefix sees nothing of this one.
func hookedStore(t *testing.T, client redis.UniversalClient, cfg redisstore.Config) (*redisstore.Store, *cmdHook) {
	t.Helper()
	cfg.Prefix = testPrefix(t, client)
	h := newCmdHook(cfg.Prefix)
	client.AddHook(h)
	return newStore(t, client, cfg), h
}

// cycleConcurrently runs cycles claim+complete cycles of new keys from
// each of callers goroutines, started together, and fails t now if one
// failed.
func cycleConcurrently(t *testing.T, s *redisstore.Store, callers, cycles int) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range cycles {
				if err := cycle(context.Background(), s, watermill.NewUUID()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// cycle claims key and completes the claim, as the middleware does for a
// new message.
func cycle(ctx context.Context, s *redisstore.Store, key string) error {
	c, err := s.Claim(ctx, "h", []string{key}, time.Minute)
	if err != nil {
		return err
	}
	if c.Result != stores.Claimed {
		return errors.New("claim of a new key: " + c.Result.String())
	}
	return s.Complete(ctx, c, time.Minute, nil)
}

func TestBatching(t *testing.T) {
	testBatching(t, sharedRedis(t))
}

// testBatching: a lone caller's calls go out one by one, each at once
// (never waiting for company); concurrent callers share pipelines, each
// with its own result; with batching off nothing is pipelined.
func testBatching(t *testing.T, client redis.UniversalClient) {
	ctx := context.Background()

	t.Run("LoneCallerSendsEachCallAtOnce", func(t *testing.T) {
		s, h := hookedStore(t, client, redisstore.Config{})
		for range 20 {
			if err := cycle(ctx, s, watermill.NewUUID()); err != nil {
				t.Fatal(err)
			}
		}
		singles, pipelines, _, _ := h.counts()
		if singles != 40 || pipelines != 0 {
			t.Fatalf("20 claim+complete cycles from one caller: %d commands sent alone and %d pipelines; want 40 and 0", singles, pipelines)
		}
	})

	concurrent := func(t *testing.T, cfg redisstore.Config) *cmdHook {
		s, h := hookedStore(t, client, cfg)
		const callers, cycles = 32, 30
		cycleConcurrently(t, s, callers, cycles)
		singles, pipelines, pipelined, largest := h.counts()
		if ops := singles + pipelined; ops != 2*callers*cycles {
			t.Fatalf("%d store commands for %d claim+complete cycles", ops, callers*cycles)
		}
		t.Logf("%d commands alone, %d in %d pipelines (largest %d)", singles, pipelined, pipelines, largest)
		return h
	}

	t.Run("ConcurrentCallersSharePipelines", func(t *testing.T) {
		const maxBatch = 16
		h := concurrent(t, redisstore.Config{Batch: redisstore.BatchConfig{MaxBatch: maxBatch}})
		singles, pipelines, pipelined, largest := h.counts()
		if largest < 2 || largest > maxBatch {
			t.Fatalf("largest pipeline carried %d commands, want 2 to MaxBatch (%d)", largest, maxBatch)
		}
		if roundTrips, ops := singles+pipelines, singles+pipelined; roundTrips*2 > ops {
			t.Fatalf("%d round trips for %d commands: concurrent calls were not coalesced", roundTrips, ops)
		}
	})

	t.Run("DisabledSendsEveryCallAlone", func(t *testing.T) {
		h := concurrent(t, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}})
		if _, pipelines, _, _ := h.counts(); pipelines != 0 {
			t.Fatalf("%d pipelines with batching disabled", pipelines)
		}
	})

	// A call is not held back by a stuck one while a slot is free: it goes
	// out at once, alone.
	t.Run("CallNotHeldBackByAStuckCall", func(t *testing.T) {
		s, h := hookedStore(t, client, redisstore.Config{})
		held, release := holdKey(s, h, "stuck")
		stuck := make(chan error, 1)
		go func() { stuck <- cycle(ctx, s, "stuck") }()
		<-held
		singles0, _, _, _ := h.counts()
		if err := cycle(ctx, s, "free"); err != nil {
			t.Fatal(err)
		}
		singles, pipelines, _, _ := h.counts()
		if singles-singles0 != 2 || pipelines != 0 {
			t.Fatalf("a claim+complete beside a stuck call: %d commands alone, %d pipelines; want 2 alone", singles-singles0, pipelines)
		}
		close(release)
		if err := <-stuck; err != nil {
			t.Fatal(err)
		}
	})
}

// TestBatchDeadlines: callers keep their own deadlines under batching, and
// a claim taken for a caller who has gone is given back.
func TestBatchDeadlines(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	one := redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}}

	t.Run("QueuedCallLeavesAtItsDeadline", func(t *testing.T) {
		s, h := hookedStore(t, client, one)
		held, release := holdKey(s, h, "stuck")
		stuck := make(chan error, 1)
		go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
		<-held // the only slot is taken

		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		queued := make(chan error, 1)
		go func() { _, err := s.Claim(cctx, "h", []string{"queued"}, time.Minute); queued <- err }()
		// It returns at its deadline while the call ahead of it still
		// holds the only slot (release is not closed yet), however long
		// after the deadline the machine lets it run.
		var err error
		select {
		case err = <-queued:
		case <-time.After(time.Minute):
			close(release)
			t.Fatal("the queued Claim did not return at its deadline while the call ahead of it held the only slot")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("queued Claim: %v, want context.DeadlineExceeded", err)
		}
		close(release)
		if err := <-stuck; err != nil {
			t.Fatal(err)
		}
		// The call that left the queue was never sent.
		if c, err := s.Claim(ctx, "h", []string{"queued"}, time.Minute); err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(queued) after = %v, %v; want claimed", c, err)
		}
	})

	t.Run("ClaimOfACallerWhoLeftIsGivenBack", func(t *testing.T) {
		s, h := hookedStore(t, client, one)
		heldStuck, releaseStuck := holdKey(s, h, "stuck")
		stuck := make(chan error, 1)
		go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
		<-heldStuck

		// Two calls queue behind it and will share a pipeline: one whose
		// caller's deadline passes while the pipeline is held (the test
		// says when: see base.DeadlineCtx), and one who stays.
		cctx := base.NewDeadlineCtx()
		defer cctx.Expire()
		heldLeft, releaseLeft := holdKey(s, h, "left")
		left := make(chan error, 1)
		go func() { _, err := s.Claim(cctx, "h", []string{"left"}, time.Minute); left <- err }()
		stays := make(chan *stores.Claim, 1)
		go func() {
			c, err := s.Claim(ctx, "h", []string{"stays"}, time.Minute)
			if err != nil {
				t.Error(err)
			}
			stays <- c
		}()
		waitFor(t, time.Minute, "both claims to queue", func() bool { return testkit.WaitingInBatcher() == 2 })

		close(releaseStuck)
		if err := <-stuck; err != nil {
			t.Fatal(err)
		}
		<-heldLeft
		cctx.Expire()
		if err := <-left; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Claim(left) = %v, want context.DeadlineExceeded", err)
		}
		close(releaseLeft) // the pipeline goes out: "left" is claimed for nobody
		if c := <-stays; c == nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(stays) = %v: a caller leaving failed the pipeline", c)
		}
		if _, pipelines, _, _ := h.counts(); pipelines == 0 {
			t.Fatal("the two queued claims did not share a pipeline")
		}
		// The orphaned claim is released in the background: the key is
		// free again long before its one-minute lease.
		waitFor(t, 5*time.Second, "the orphaned claim to be given back", func() bool {
			c, err := s.Claim(ctx, "h", []string{"left"}, time.Minute)
			return err == nil && c.Result == stores.Claimed
		})
	})
}

// fakeRedisError is a server error reply, as go-redis reports one.
type fakeRedisError string

func (e fakeRedisError) Error() string { return string(e) }
func (fakeRedisError) RedisError()     {}

// refuseSetNXGet answers every SET of the store's keys as a Redis older
// than 7.0 does.
type refuseSetNXGet struct {
	prefix string
	sets   atomic.Int32
}

func (h *refuseSetNXGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseSetNXGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name, _ := cmd.Args()[0].(string); strings.EqualFold(name, "set") && strings.HasPrefix(cmdKey(cmd), h.prefix) {
			h.sets.Add(1)
			err := fakeRedisError("ERR syntax error")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *refuseSetNXGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestOldServerClaimsByScript: on a Redis that refuses SET NX GET (older
// than 7.0), single-key claims fall back to the claim script, for good.
func TestOldServerClaimsByScript(t *testing.T) {
	ctx := context.Background()
	client := newClient(t, testkit.RequireRedis(t))
	prefix := testPrefix(t, client)
	h := &refuseSetNXGet{prefix: prefix}
	client.AddHook(h)
	s := newStore(t, client, redisstore.Config{Prefix: prefix})
	for _, k := range []string{"a", "b", "c"} {
		if err := cycle(ctx, s, k); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Claim(ctx, "h", []string{k}, time.Minute); err != nil || d.Result != stores.Duplicate {
			t.Fatalf("second Claim(%q) = %v, %v", k, d, err)
		}
	}
	if n := h.sets.Load(); n != 1 {
		t.Fatalf("%d SET NX GET tried, want 1 (then the script only)", n)
	}
}

// TestCompactKeys: the key is Prefix and 12 bytes whatever the scope and
// key, different pairs get different keys, and the config is checked.
func TestCompactKeys(t *testing.T) {
	s, err := redisstore.New(redis.NewClient(&redis.Options{}), redisstore.Config{CompactKeys: true, SkipServerCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	seen := map[string]bool{}
	for _, scope := range []string{"orders", "a-much-longer-handler-name", "a:b", ""} {
		for _, key := range []string{watermill.NewUUID(), "k", strings.Repeat("x", 1<<20), "msg:" + watermill.NewUUID()} {
			rk := s.EncodeKey(scope, key)
			if !strings.HasPrefix(rk, redisstore.DefaultCompactPrefix) || len(rk) != len(redisstore.DefaultCompactPrefix)+12 {
				t.Fatalf("EncodeKey(%q, %d-byte key) = %q: want %q and 12 bytes", scope, len(key), rk, redisstore.DefaultCompactPrefix)
			}
			if seen[rk] {
				t.Fatalf("EncodeKey(%q, %q) collides", scope, key)
			}
			seen[rk] = true
		}
	}
	if err := (redisstore.Config{CompactKeys: true, DigestKeysLongerThan: 16}).Validate(); err == nil {
		t.Fatal("CompactKeys with DigestKeysLongerThan accepted")
	}
}

// holdHook holds every command or pipeline naming "slowkey" until release
// is closed, and says so on held (its hold is the client's
// redistest.RedisTap).
type holdHook struct{ held, release chan struct{} }

func (h holdHook) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		if strings.Contains(fmt.Sprint(c.Args()), "slowkey") {
			h.held <- struct{}{}
			<-h.release
			return
		}
	}
}

// TestLingeringCompleteBesideASlowCall: a Complete whose context carries
// stores.WithLinger goes out once its linger has passed, in the pipeline
// slot left free beside a call that is slow to answer (the default
// batching has two): it waited for that call, until its own deadline,
// before.
func TestLingeringCompleteBesideASlowCall(t *testing.T) {
	addr := testkit.RequireRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	h := holdHook{held: make(chan struct{}, 1), release: make(chan struct{})}
	client.AddHook(redistest.RedisTap(h.hold))
	prefix := fmt.Sprintf("dedup-linger-%d:", time.Now().UnixNano())
	t.Cleanup(func() { _ = redisclean.DeletePrefix(context.Background(), client, prefix) })
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	ctx := context.Background()
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatal(c, err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, "s", []string{"slowkey"}, time.Minute)
		slow <- err
	}()
	<-h.held
	defer func() {
		close(h.release)
		if err := <-slow; err != nil {
			t.Errorf("the slow claim: %v", err)
		}
	}()
	// Bounded, so that a Complete left waiting fails the test instead of
	// hanging it; far longer than the linger.
	lctx, cancel := context.WithTimeout(stores.WithLinger(ctx, time.Millisecond), 30*time.Second)
	defer cancel()
	if err := s.Complete(lctx, c, time.Hour, nil); err != nil {
		t.Fatalf("a lingering Complete beside a slow call: %v", err)
	}
}

// lingerStore returns a store on the shared Redis under a prefix of its
// own, and its client, which the test may close. When t ends, after the
// test's own cleanups, a client of its own deletes every key under the
// prefix (SCAN and UNLINK) and checks none is left: the store's client,
// closed by then, deleted nothing.
func lingerStore(t *testing.T, cfg redisstore.Config) (*redis.Client, *redisstore.Store) {
	t.Helper()
	addr := testkit.RequireRedis(t)
	cfg.Prefix = "dedup-linger2-" + storetest.NewID() + ":"
	cleaner := newClient(t, addr)
	t.Cleanup(func() {
		deletePrefix(t, cleaner, cfg.Prefix)
		if n := countPrefix(t, cleaner, cfg.Prefix); n > 0 {
			t.Errorf("%d keys left under %s", n, cfg.Prefix)
		}
	})
	client := redis.NewClient(&redis.Options{Addr: addr})
	s, err := redisstore.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client, s
}

// TestSecondLingeringCompleteIsSent: two lingering Completes (150ms, then
// 800ms), MaxBatch 1, no other traffic: the timer sends the first alone,
// and the second, left queued, is sent at its own due time. It was left
// with no timer armed, and failed at its deadline.
func TestSecondLingeringCompleteIsSent(t *testing.T) {
	client, s := lingerStore(t, redisstore.Config{Batch: redisstore.BatchConfig{MaxBatch: 1}})
	t.Cleanup(func() { _ = s.Close(context.Background()); _ = client.Close() })
	ctx := context.Background()
	c1, err := s.Claim(ctx, "s", []string{"k1"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.Claim(ctx, "s", []string{"k2"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e1, e2 := make(chan error, 1), make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(stores.WithLinger(ctx, 150*time.Millisecond), 5*time.Second)
		defer cancel()
		e1 <- s.Complete(lctx, c1, time.Hour, nil)
	}()
	testkit.WaitFor(t, 10*time.Second, "1 queued ahead of 2", func() bool { return s.Queued() == 1 })
	go func() {
		lctx, cancel := context.WithTimeout(stores.WithLinger(ctx, 800*time.Millisecond), 5*time.Second)
		defer cancel()
		e2 <- s.Complete(lctx, c2, time.Hour, nil)
	}()
	if err := <-e1; err != nil {
		t.Fatalf("Complete 1: %v", err)
	}
	if err := <-e2; err != nil {
		t.Fatalf("Complete 2 (linger 800ms, deadline 5s): %v", err)
	}
}

// Close sends the lingering calls and returns once they are out: a
// client closed right after does not fail them.
func TestCloseSendsTheLingeringCompleteBeforeTheClientCloses(t *testing.T) {
	client, s := lingerStore(t, redisstore.Config{})
	ctx := context.Background()
	c1, err := s.Claim(ctx, "s", []string{"k1"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e1 := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(stores.WithLinger(ctx, time.Hour), 10*time.Second)
		defer cancel()
		e1 <- s.Complete(lctx, c1, time.Hour, nil)
	}()
	testkit.WaitFor(t, 10*time.Second, "the Complete queued", func() bool { return s.Queued() == 1 })
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_ = client.Close()
	if err := <-e1; err != nil {
		t.Fatalf("lingering Complete under way at Close: %v", err)
	}
}

// A multi-key claim (the claim script) that succeeds in a pipeline for a
// caller who has already given up is given back in the background, as a
// single-key one is: its keys are free again long before the lease.
func TestBatchOrphanedMultiKeyClaimIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	s, h := hookedStore(t, client, redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}})
	stays := orphanMultiKeyClaim(t, s, h)
	r := <-stays
	if r.err != nil {
		t.Error(r.err)
	}
	if r.c == nil || r.c.Result != stores.Claimed {
		t.Fatalf("Claim(stays) = %v: a caller leaving failed the pipeline", r.c)
	}
	if _, pipelines, _, _ := h.counts(); pipelines == 0 {
		t.Fatal("the two queued claims did not share a pipeline")
	}
	waitFor(t, 5*time.Second, "the orphaned multi-key claim to be given back", func() bool {
		c, err := s.Claim(ctx, "h", []string{"left-b", "left-a"}, time.Minute)
		return err == nil && c.Result == stores.Claimed
	})
}

// An orphaned multi-key claim that took over an expired lease gives that
// record back to its owner, on the key it was taken from: the previous
// owner, whose lease ended less than a lease ago, can still complete.
func TestBatchOrphanedTakeoverIsPutBack(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	s, h := hookedStore(t, client, redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}})
	leftKey := s.EncodeKey("h", "left-a")

	// An hour's lease, aged past its end: its record is kept for most of
	// another hour, however slow the rest of the test runs.
	const lease = time.Hour
	prev, err := s.Claim(ctx, "h", []string{"left-a"}, lease)
	if err != nil || prev.Result != stores.Claimed {
		t.Fatalf("Claim(left-a) = %+v, %v", prev, err)
	}
	age(t, client, lease+time.Second, leftKey) // prev's lease ran out; nobody took it over yet

	stays := orphanMultiKeyClaim(t, s, h) // it takes left-a over, for nobody
	if r := <-stays; r.err != nil {
		t.Fatal(r.err)
	}
	waitFor(t, time.Minute, "the orphaned claim to give left-b back", func() bool {
		c, err := s.Claim(ctx, "h", []string{"left-b"}, time.Minute)
		return err == nil && c.Result == stores.Claimed
	})
	// left-a is put back to the previous owner's record by a give-back of
	// its own, on its node, which may still be under way: a Complete
	// before it fails with ErrLostClaim and writes nothing.
	var err2 error
	waitFor(t, time.Minute, "the previous owner's Complete after the orphaned takeover was undone", func() bool {
		err2 = s.Complete(ctx, prev, time.Hour, nil)
		return err2 == nil || !errors.Is(err2, stores.ErrLostClaim)
	})
	if err2 != nil {
		t.Fatalf("the previous owner's Complete after the orphaned takeover was undone = %v", err2)
	}
}

// orphanMultiKeyClaim makes a claim of "left-a" and "left-b" (scope "h")
// that s runs for nobody: behind a claim of "stuck" that holds the
// store's only slot, it queues that claim and one of "stays" after it,
// so the two share a pipeline; it ends the first caller's context while
// the hook holds that pipeline, checks the caller got context.Canceled,
// and lets the pipeline go. It returns what the claim of "stays" gets.
func orphanMultiKeyClaim(t *testing.T, s *redisstore.Store, h *cmdHook) <-chan claimResult {
	t.Helper()
	ctx := context.Background()
	heldStuck, releaseStuck := holdKey(s, h, "stuck")
	stuck := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
	<-heldStuck // the only slot is taken

	heldLeft, releaseLeft := holdKey(s, h, "left-a")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	left := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, "h", []string{"left-a", "left-b"}, time.Minute); left <- err }()
	waitFor(t, 5*time.Second, "the multi-key claim to queue", func() bool { return testkit.WaitingInBatcher() == 1 })
	stays := claimAsync(ctx, s, "h", "stays")
	waitFor(t, 5*time.Second, "both claims to queue", func() bool { return testkit.WaitingInBatcher() == 2 })

	close(releaseStuck)
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	<-heldLeft // the pipeline of both is held
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim(left-a, left-b) = %v, want context.Canceled", err)
	}
	close(releaseLeft) // the pipeline goes out: both keys are claimed for nobody
	return stays
}
