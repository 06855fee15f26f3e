package redisstore_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

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
// callers at once, each with a deadline of 2s (the middleware's
// StoreTimeout), make the calls whose WAITs are not a lane's: multi-key
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
			ctx, cancel := context.WithTimeout(bg, 2*time.Second)
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
