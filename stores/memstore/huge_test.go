package memstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

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
