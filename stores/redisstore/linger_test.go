package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// holdHook holds every command or pipeline naming "slowkey" until release
// is closed, and says so on held.
type holdHook struct{ held, release chan struct{} }

func (h holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h holdHook) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		if strings.Contains(fmt.Sprint(c.Args()), "slowkey") {
			h.held <- struct{}{}
			<-h.release
			return
		}
	}
}
func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.hold([]redis.Cmder{cmd}); return next(ctx, cmd) }
}
func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.hold(cmds); return next(ctx, cmds) }
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
	client.AddHook(h)
	prefix := fmt.Sprintf("dedup-linger-%d:", time.Now().UnixNano())
	t.Cleanup(func() { _ = testkit.DeleteRedisPrefix(context.Background(), client, prefix) })
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
// own, deleted afterwards, and its client.
func lingerStore(t *testing.T, cfg redisstore.Config) (*redis.Client, *redisstore.Store) {
	t.Helper()
	addr := testkit.RequireRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	cfg.Prefix = fmt.Sprintf("dedup-linger2-%d:", time.Now().UnixNano())
	t.Cleanup(func() { _ = testkit.DeleteRedisPrefix(context.Background(), client, cfg.Prefix) })
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
