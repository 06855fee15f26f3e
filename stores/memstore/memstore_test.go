package memstore_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newStore(t *testing.T, clock stores.Clock) stores.Store {
	return newStoreOf(t, memstore.Config{Clock: clock})
}

// newOneShard is newStore with every key in one shard.
func newOneShard(t *testing.T, clock stores.Clock) stores.Store {
	return newStoreOf(t, memstore.Config{Clock: clock, Shards: 1})
}

// newStoreOf returns a store on cfg, closed when t ends.
func newStoreOf(t *testing.T, cfg memstore.Config) *memstore.Store {
	t.Helper()
	s, err := memstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, newStore, storetest.AdminNoScopes())
}

func TestConformanceOneShard(t *testing.T) {
	storetest.Run(t, newOneShard, storetest.AdminNoScopes())
}

// On the system clock the store keeps monotonic time; leases and
// retention still expire in real time.
func TestSystemClockExpiry(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	c, err := s.Claim(ctx, "s", []string{"k"}, 30*time.Millisecond)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	deadline := time.Now().Add(time.Minute)
	const retention = 300 * time.Millisecond
	var completing time.Time
	for {
		again, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if again.Result == stores.Claimed {
			if !again.Takeover {
				t.Fatal("claim after the lease expired: not reported as a takeover")
			}
			completing = time.Now()
			if err := s.Complete(ctx, again, retention, nil); err != nil {
				t.Fatal(err)
			}
			break
		}
		if again.Result != stores.InProgress || time.Now().After(deadline) {
			t.Fatalf("claim while leased: %v, want InProgress until the lease expires", again.Result)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Within its retention the record is a duplicate. A loaded machine may
	// ask only after the retention ran out (measured from before the
	// Complete, the earliest it can have started): the record may then be
	// gone already, which is the expiry the test waits for next.
	d, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	switch {
	case err != nil:
		t.Fatal(err)
	case d.Result == stores.Duplicate:
	case d.Result == stores.Claimed && time.Since(completing) >= retention:
		return // retention is over
	default:
		t.Fatalf("claim of a done record %s after its Complete = %+v; want Duplicate within its %s retention", time.Since(completing), d, retention)
	}
	for {
		c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if c.Result == stores.Claimed {
			return // retention is over
		}
		if time.Now().After(deadline) {
			t.Fatalf("done record never expired: %v", c.Result)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []memstore.Config{{Shards: 3}, {Shards: -1}, {Shards: 1 << 17}, {SweepInterval: -time.Second}} {
		if _, err := memstore.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
}

func TestSweepRemovesExpired(t *testing.T) {
	ctx := context.Background()
	s, clock := newClockedEvery(t, time.Hour)
	for _, k := range []string{"a", "b", "c"} {
		c, err := s.Claim(ctx, "scope", []string{k}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if k != "c" {
			if err := s.Complete(ctx, c, time.Minute, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d live records", n)
	}
	clock.Advance(2 * time.Minute)
	// The done records are gone; the expired lease is kept for one more
	// sweep interval so a takeover is still seen as one.
	if n := s.Sweep(); n != 2 {
		t.Fatalf("Sweep removed %d records, want 2", n)
	}
	clock.Advance(2 * time.Hour)
	if n := s.Sweep(); n != 1 {
		t.Fatalf("second Sweep removed %d records, want 1", n)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after sweeping everything", n)
	}
}

// An expired lease longer than SweepInterval is kept for a lease length
// after it expired, as the Store contract asks: a late redelivery is still
// reported as a takeover.
func TestSweepKeepsAnExpiredLeaseForALease(t *testing.T) {
	ctx := context.Background()
	s, clock := newClockedEvery(t, time.Minute)
	if _, err := s.Claim(ctx, "scope", []string{"k"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour + 30*time.Minute)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d records half a lease after the lease expired", n)
	}
	c, err := s.Claim(ctx, "scope", []string{"k"}, time.Hour)
	if err != nil || c.Result != stores.Claimed || !c.Takeover {
		t.Fatalf("claim after the sweep: %+v, %v; want a takeover", c, err)
	}
}

func TestCloseStopsSweeper(t *testing.T) {
	s, err := memstore.New(memstore.Config{SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// BenchmarkMemoryPerRecord reports the Go heap per done record with
// 36-byte keys (a UUID), measured over one million records.
func BenchmarkMemoryPerRecord(b *testing.B) {
	const n = 1_000_000
	ctx := context.Background()
	for range b.N {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%08x-5f2a-4c0d-9a51-%012x", i, i*7919)
		}
		before := heapAlloc()
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			c, err := s.Claim(ctx, "loyalty", []string{k}, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				b.Fatal(err)
			}
		}
		after := heapAlloc()
		b.ReportMetric(float64(after-before)/n, "bytes/record")
		runtime.KeepAlive(keys)
		_ = s.Close(ctx)
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

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
	s, clock := newClockedEvery(t, time.Minute)

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

// sweep is the store's housekeeping for the model: it may forget only
// what the contract lets it forget.
func sweep(_ context.Context, s stores.Store) error {
	s.(*memstore.Store).Sweep()
	return nil
}

// TestModel checks the store against the model of the Store contract,
// to the nanosecond on a fake clock, with Sweep run between calls.
func TestModel(t *testing.T) {
	storetest.RunModel(t, newStore, storetest.Maintenance(sweep))
}

// TestModelOneShard runs the model with every key in one shard, where
// the keys of a multi-key claim share a lock and a table.
func TestModelOneShard(t *testing.T) {
	storetest.RunModel(t, newOneShard, storetest.Maintenance(sweep))
}

// TestModelSystemClock runs the model in real time on the system clock,
// which the store reads as monotonic time.
func TestModelSystemClock(t *testing.T) {
	storetest.RunModel(t, newStore, storetest.RealTime(50*time.Millisecond), storetest.Maintenance(sweep))
}

// TestHugeDurations: a lease or retention of math.MaxInt64 means "for
// ever" (saturated), never a time that wraps around into the past, on the
// system clock (monotonic) and on an injected one.
func TestHugeDurations(t *testing.T) {
	for name, clock := range map[string]stores.Clock{
		"system": nil,
		"fake":   storetest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)),
	} {
		t.Run(name, func(t *testing.T) {
			s, err := memstore.New(memstore.Config{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			ctx := context.Background()
			for _, keys := range [][]string{{"one"}, {"a", "b"}} {
				c, err := s.Claim(ctx, "s", keys, math.MaxInt64)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(%q, MaxInt64) = %+v, %v", keys, c, err)
				}
				if again, err := s.Claim(ctx, "s", keys, time.Second); err != nil || again.Result != stores.InProgress {
					t.Fatalf("Claim of a key leased for ever = %+v, %v; want InProgress (the lease wrapped around)", again, err)
				}
				if err := s.Extend(ctx, c, math.MaxInt64); err != nil {
					t.Fatal(err)
				}
				if again, err := s.Claim(ctx, "s", keys, time.Second); err != nil || again.Result != stores.InProgress {
					t.Fatalf("Claim after Extend(MaxInt64) = %+v, %v; want InProgress", again, err)
				}
				if err := s.Complete(ctx, c, math.MaxInt64, nil); err != nil {
					t.Fatal(err)
				}
				if dup, err := s.Claim(ctx, "s", keys, time.Second); err != nil || dup.Result != stores.Duplicate {
					t.Fatalf("Claim after Complete(MaxInt64) = %+v, %v; want Duplicate", dup, err)
				}
			}
			// An expired lease is kept one more longest lease (here: for
			// ever) by Sweep, not dropped by an overflowing grace.
			if fc, ok := clock.(*storetest.FakeClock); ok {
				c, err := s.Claim(ctx, "s", []string{"short"}, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				fc.Advance(time.Hour)
				s.Sweep()
				if err := s.Release(ctx, c); err != nil {
					t.Fatalf("Release of an expired claim after Sweep = %v; Sweep dropped it before one longest lease passed", err)
				}
			}
		})
	}
}
