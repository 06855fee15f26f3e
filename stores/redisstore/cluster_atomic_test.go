package redisstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

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
