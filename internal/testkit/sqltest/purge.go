package sqltest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// PurgeBatches reports how many purge statements ran and the most records
// one of them deleted.
type PurgeBatches func() (batches, largest int64)

// RunPurge fills s's table (PurgeBatch 100, PurgeGrace 1m, on clock) with
// expired and live records, then purges while claims go on: every
// expired record goes, no live one, there are at least as many batches
// as 100-record ones would need and none is larger, and the claims never
// fail. watch starts counting the purge's batches just before it runs.
func RunPurge(t *testing.T, s *sqlstore.Store, clock *storetest.FakeClock, watch func() PurgeBatches) {
	ctx := context.Background()

	const expiredDone, abandoned, fresh = 1200, 150, 100
	claim := func(key string, lease time.Duration) *stores.Claim {
		t.Helper()
		c, err := s.Claim(ctx, "purge", []string{key}, lease)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(%s): %v %v", key, c, err)
		}
		return c
	}
	Bounded(expiredDone, 16, func(i int) {
		tx, err := s.Begin(ctx, "purge", []string{"old-" + storetest.NewID()}, time.Minute)
		if err == nil {
			err = tx.Commit(ctx, []byte{byte(i)})
		}
		if err != nil {
			t.Error(err)
		}
	})
	for i := range abandoned { // processing, lease ran out long ago
		_ = i
		claim("abandoned-"+storetest.NewID(), time.Second)
	}
	clock.Advance(5 * time.Minute)
	// Live: done records within retention, a processing record whose
	// lease ran out within the grace, and one whose lease is valid.
	var live []string
	for range fresh {
		k := "fresh-" + storetest.NewID()
		if err := s.Complete(ctx, claim(k, time.Minute), time.Hour, nil); err != nil {
			t.Fatal(err)
		}
		live = append(live, k)
	}
	graceKey := "grace-" + storetest.NewID()
	claim(graceKey, time.Second)
	clock.Advance(30 * time.Second) // expired 29s ago, grace is 1m
	// Leases stay within the grace: the purge keeps an expired claim
	// for the longest lease given, too.
	leased := claim("leased-"+storetest.NewID(), 50*time.Second)
	// Done, with less retention left than the grace: live all the
	// same (the grace is for abandoned leases only).
	soon := "soon-" + storetest.NewID()
	if err := s.Complete(ctx, claim(soon, time.Minute), 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	live = append(live, soon)

	counted := watch()
	stop := make(chan struct{})
	var claims, slowest atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			c := claim("during-"+storetest.NewID(), time.Minute)
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Error(err)
			}
			if d := time.Since(start); d.Nanoseconds() > slowest.Load() {
				slowest.Store(d.Nanoseconds())
			}
			claims.Add(1)
		}
	}()
	n, err := s.Purge(ctx)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(expiredDone + abandoned); n != want {
		t.Errorf("Purge deleted %d records, want %d", n, want)
	}
	batches, largest := counted()
	if largest > 100 || batches < (expiredDone+abandoned)/100 {
		t.Errorf("%d batches, largest %d; want at least %d of at most 100", batches, largest, (expiredDone+abandoned)/100)
	}
	for _, k := range live {
		c, err := s.Claim(ctx, "purge", []string{k}, time.Minute)
		if err != nil || c.Result != stores.Duplicate {
			t.Fatalf("live done record %s after purge: %v %v", k, c, err)
		}
	}
	c, err := s.Claim(ctx, "purge", []string{graceKey}, time.Minute)
	if err != nil || c.Result != stores.Claimed || !c.Takeover {
		t.Fatalf("processing record within the grace: %+v %v, want a takeover", c, err)
	}
	if err := s.Extend(ctx, leased, 50*time.Second); err != nil {
		t.Fatalf("the live lease was purged: %v", err)
	}
	if again, err := s.Purge(ctx); err != nil || again != 0 {
		t.Fatalf("second Purge = %d, %v; want 0", again, err)
	}
	t.Logf("%s: %d records in %d batches, the largest of %d; %d claims ran meanwhile, slowest %s",
		s.Dialect(), n, batches, largest, claims.Load(), time.Duration(slowest.Load()))
}
