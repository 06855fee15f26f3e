package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

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
			p := testkit.NewProxy(t, addr)
			c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
			t.Cleanup(func() { _ = c.Close() })
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
			done, cancelDone := context.WithCancel(bg)
			cancelDone()
			_, err = s.Claim(done, "s", []string{"k"}, time.Minute)
			errtest.NotOutage(t, "Claim with a cancelled context", err, context.Canceled)
			expired, cancelExpired := context.WithDeadline(bg, time.Now().Add(-time.Second))
			defer cancelExpired()
			_, err = s.Claim(expired, "s", []string{"k"}, time.Minute)
			errtest.NotOutage(t, "Claim with an expired context", err, context.DeadlineExceeded)
			errtest.NotOutage(t, "Complete with an expired context", s.Complete(expired, held, time.Hour, nil), context.DeadlineExceeded)
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
