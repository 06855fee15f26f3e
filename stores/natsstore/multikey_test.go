package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// orderedKeys returns two keys of scope whose records s writes in the
// order first, second.
func orderedKeys(s *natsstore.Store, scope string) (first, second string) {
	for i := 0; ; i++ {
		a, b := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		if s.Subject(scope, a) < s.Subject(scope, b) {
			return a, b
		}
	}
}

// twoStores returns two stores sharing a bucket and a fake clock: two
// consumer processes.
func twoStores(t *testing.T) (s, other *natsstore.Store, clock *storetest.FakeClock) {
	nc := sharedConn(t)
	clock = storetest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	cfg := natsstore.Config{Bucket: testBucket(), Clock: clock}
	return newStore(t, nc, cfg), newStore(t, nc, cfg), clock
}

func claim(t *testing.T, s stores.Store, scope string, lease time.Duration, keys ...string) *stores.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), scope, keys, lease)
	if err != nil {
		t.Fatalf("Claim(%q): %v", keys, err)
	}
	return c
}

func mustResult(t *testing.T, c *stores.Claim, want stores.Result, takeover bool) {
	t.Helper()
	if c.Result != want || c.Takeover != takeover {
		t.Fatalf("Claim(%q) = %s takeover=%v, want %s takeover=%v", c.Keys, c.Result, c.Takeover, want, takeover)
	}
}

// TestClaimGivesBackOnConflict: a multi-key claim that finds its second
// key taken between its read and its write gives the first back and
// answers InProgress; the first key is free at once, not held until a
// lease runs out.
func TestClaimGivesBackOnConflict(t *testing.T) {
	s, other, _ := twoStores(t)
	const scope = "h"
	k1, k2 := orderedKeys(s, scope)
	var rival *stores.Claim
	s.SetAfterWrite(func(op string, i int) {
		if op == "claim" && i == 0 && rival == nil {
			rival = claim(t, other, scope, time.Minute, k2)
			mustResult(t, rival, stores.Claimed, false)
		}
	})
	c := claim(t, s, scope, time.Minute, k1, k2)
	mustResult(t, c, stores.InProgress, false)
	if c.Token != "" {
		t.Fatalf("InProgress with token %q", c.Token)
	}
	s.SetAfterWrite(nil)
	c1 := claim(t, other, scope, time.Minute, k1)
	mustResult(t, c1, stores.Claimed, false)
	mustResult(t, claim(t, other, scope, time.Minute, k2), stores.InProgress, false)
}

// TestClaimRetriesAfterRelease: a key claimed and released by another
// process between a claim's read and its write has a new revision, so
// the write fails; the claim gives back what it took, reads again, finds
// the key free and takes every key, instead of answering InProgress.
func TestClaimRetriesAfterRelease(t *testing.T) {
	s, other, _ := twoStores(t)
	const scope = "h"
	k1, k2 := orderedKeys(s, scope)
	rounds := 0
	s.SetAfterWrite(func(op string, i int) {
		rounds++
		if rounds == 1 {
			c := claim(t, other, scope, time.Minute, k2)
			mustResult(t, c, stores.Claimed, false)
			if err := other.Release(context.Background(), c); err != nil {
				t.Errorf("Release: %v", err)
			}
		}
	})
	c := claim(t, s, scope, time.Minute, k1, k2)
	mustResult(t, c, stores.Claimed, false)
	if rounds != 2 {
		t.Fatalf("the claim took %d rounds, want 2", rounds)
	}
	s.SetAfterWrite(nil)
	mustResult(t, claim(t, other, scope, time.Minute, k1), stores.InProgress, false)
	mustResult(t, claim(t, other, scope, time.Minute, k2), stores.InProgress, false)
}

// TestClaimGiveBackRestoresTakenOverLease: a multi-key claim that took
// over an expired lease and then lost its second key puts the old
// owner's record back: the old owner still owns its key and completes.
func TestClaimGiveBackRestoresTakenOverLease(t *testing.T) {
	s, other, clock := twoStores(t)
	const scope = "h"
	k1, k2 := orderedKeys(s, scope)
	old := claim(t, other, scope, time.Second, k1)
	mustResult(t, old, stores.Claimed, false)
	clock.Advance(1500 * time.Millisecond)
	s.SetAfterWrite(func(op string, i int) {
		if op == "claim" && i == 0 {
			mustResult(t, claim(t, other, scope, time.Minute, k2), stores.Claimed, false)
		}
	})
	mustResult(t, claim(t, s, scope, time.Minute, k1, k2), stores.InProgress, false)
	s.SetAfterWrite(nil)
	if err := other.Complete(context.Background(), old, time.Hour, []byte("old")); err != nil {
		t.Fatalf("Complete by the owner of the lease the failed claim took over: %v", err)
	}
	d := claim(t, s, scope, time.Minute, k1)
	mustResult(t, d, stores.Duplicate, false)
	if string(d.Data) != "old" {
		t.Fatalf("Data = %q", d.Data)
	}
}

// TestFencedCallPutsBack: a Complete, Release or Extend of two keys
// whose second key is taken over between its writes fails with
// ErrLostClaim and puts the first key back to the claim's record.
func TestFencedCallPutsBack(t *testing.T) {
	for _, op := range []string{"complete", "release", "extend"} {
		t.Run(op, func(t *testing.T) {
			s, other, clock := twoStores(t)
			const scope = "h"
			k1, k2 := orderedKeys(s, scope)
			c := claim(t, s, scope, time.Second, k1, k2)
			mustResult(t, c, stores.Claimed, false)
			clock.Advance(1500 * time.Millisecond) // the lease ran out; still the claim's
			s.SetAfterWrite(func(o string, i int) {
				if o == op && i == 0 {
					mustResult(t, claim(t, other, scope, time.Minute, k2), stores.Claimed, true)
				}
			})
			ctx := context.Background()
			var err error
			switch op {
			case "complete":
				err = s.Complete(ctx, c, time.Hour, []byte("x"))
			case "release":
				err = s.Release(ctx, c)
			default:
				err = s.Extend(ctx, c, time.Minute)
			}
			errtest.Wraps(t, op+" of a claim whose key was taken over", err, stores.ErrLostClaim)
			s.SetAfterWrite(nil)
			// k1 is the claim's expired lease again: a claim takes it
			// over (it is neither done, nor free, nor leased anew).
			mustResult(t, claim(t, other, scope, time.Minute, k1), stores.Claimed, true)
		})
	}
}
