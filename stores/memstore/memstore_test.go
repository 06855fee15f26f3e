package memstore_test

import (
	"context"
	"fmt"
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
	s, err := memstore.New(memstore.Config{Clock: clock})
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
	storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
		s, err := memstore.New(memstore.Config{Clock: clock, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}, storetest.AdminNoScopes())
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
	clock := storetest.NewFakeClock(time.Unix(1_000_000, 0))
	s, err := memstore.New(memstore.Config{Clock: clock, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
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
	clock := storetest.NewFakeClock(time.Unix(1_000_000, 0))
	s, err := memstore.New(memstore.Config{Clock: clock, SweepInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
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
