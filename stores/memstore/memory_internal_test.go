package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// A table holds up to 3/4 of its slots, and right after it doubles it is
// more than 3/8 full: the memory per record the package documents.
func TestTableLoadBounds(t *testing.T) {
	var tb table
	for n := 1; n <= 5000; n++ {
		tb.put(hkey{a: uint64(n), b: uint64(n) * 0x9e3779b97f4a7c15}, record{until: 1})
		l := len(tb.slots)
		if 4*n > 3*l {
			t.Fatalf("%d records in %d slots: fuller than 3/4", n, l)
		}
		if l > minSlots && 8*n <= 3*l {
			t.Fatalf("%d records in %d slots: at most 3/8 full without a delete", n, l)
		}
	}
}

// Store.hash never gives the zero hkey (an empty slot), and both of its
// halves vary with the key: the shard comes from one, the table slot from
// the other, and the record is told apart by both.
func TestHashHalves(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	const n = 10_000
	as, bs := map[uint64]bool{}, map[uint64]bool{}
	for i := range n {
		h := s.hash("scope", fmt.Sprint("key-", i))
		if h == (hkey{}) {
			t.Fatalf("key %d hashed to the zero hkey", i)
		}
		as[h.a], bs[h.b] = true, true
	}
	if len(as) != n || len(bs) != n {
		t.Fatalf("%d keys gave %d distinct first halves and %d distinct second halves", n, len(as), len(bs))
	}
}

// dataHeld returns how many records' data the store holds.
func (s *Store) dataHeld() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.data)
		sh.mu.Unlock()
	}
	return n
}

// The data kept with a done record is freed with the record: when an
// expired record is claimed again, and when the sweeper removes it.
func TestDataFreedWithItsRecord(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewFakeClock(time.Unix(1_000_000, 0))
	s, err := New(Config{Clock: clock, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	for _, keys := range [][]string{{"k"}, {"m1", "m2"}} {
		c, err := s.Claim(ctx, "s", keys, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("claim %q: %+v, %v", keys, c, err)
		}
		if err := s.Complete(ctx, c, time.Minute, []byte("outputs")); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.dataHeld(); n != 3 {
		t.Fatalf("data held for %d records, want 3", n)
	}
	clock.Advance(2 * time.Minute)

	// Claimed again after its retention: the old data goes.
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("claim after retention: %+v, %v", c, err)
	}
	if n := s.dataHeld(); n != 2 {
		t.Fatalf("data held for %d records after one was claimed again, want 2", n)
	}
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}

	// Swept: the data goes with the records.
	if n := s.Sweep(); n != 2 {
		t.Fatalf("Sweep removed %d records, want 2", n)
	}
	if n := s.dataHeld(); n != 0 {
		t.Fatalf("data held for %d records after the sweep removed them all", n)
	}
}
