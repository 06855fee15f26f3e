package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The shard counts the documentation allows, up to 65536, are accepted.
func TestConfigValidShards(t *testing.T) {
	for _, n := range []int{0, 1, 2, 1 << 10, 1 << 16} {
		s, err := memstore.New(memstore.Config{Shards: n})
		if err != nil {
			t.Errorf("New with %d shards: %v", n, err)
			continue
		}
		_ = s.Close(context.Background())
	}
}

// Sweep removes a done record from the instant it expires (the instant
// Claim no longer finds it live), and keeps an expired processing record
// up to and including the end of its grace (the longest lease given),
// when a claim is still reported as a takeover.
func TestSweepAtTheBoundaries(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewFakeClock(time.Unix(1_000_000, 0))
	s, err := memstore.New(memstore.Config{Clock: clock, SweepInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	done, err := s.Claim(ctx, "s", []string{"done"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, 10*time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "s", []string{"leased"}, time.Hour); err != nil {
		t.Fatal(err)
	}

	clock.Advance(10*time.Minute - time.Nanosecond)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d records a nanosecond before any expired", n)
	}
	clock.Advance(time.Nanosecond)
	if n := s.Sweep(); n != 1 {
		t.Fatalf("Sweep at the done record's expiry removed %d records, want 1", n)
	}

	// The lease ends at +1h; its grace is the longest lease given, 1h.
	clock.Advance(2*time.Hour - 10*time.Minute)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep at the end of the lease's grace removed %d records, want 0", n)
	}
	c, err := s.Claim(ctx, "s", []string{"leased"}, time.Minute)
	if err != nil || c.Result != stores.Claimed || !c.Takeover {
		t.Fatalf("claim at the end of the grace: %+v, %v; want a takeover", c, err)
	}
	// That claim's lease, a minute, ends; an hour (the longest lease) and a
	// nanosecond later the sweep removes it.
	clock.Advance(time.Minute + time.Hour)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep at the end of the grace removed %d records, want 0", n)
	}
	clock.Advance(time.Nanosecond)
	if n := s.Sweep(); n != 1 {
		t.Fatalf("Sweep a nanosecond after the grace removed %d records, want 1", n)
	}
}
