package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func newClocked(t *testing.T) (*memstore.Store, *storetest.FakeClock) {
	t.Helper()
	return newClockedEvery(t, time.Minute)
}

// newClockedEvery is newClocked sweeping every interval.
func newClockedEvery(t *testing.T, interval time.Duration) (*memstore.Store, *storetest.FakeClock) {
	t.Helper()
	clock := storetest.NewFakeClock(time.Unix(1_000_000, 0))
	return newStoreOf(t, memstore.Config{Clock: clock, SweepInterval: interval}), clock
}

// TestListPagesThroughEveryRecord: pages of a few records each, across
// shards, list every record once, in increasing ID order, and the last
// full page says there is no next one.
func TestListPagesThroughEveryRecord(t *testing.T) {
	ctx := context.Background()
	s, _ := newClocked(t)
	const n, limit = 100, 7
	for i := range n {
		if _, err := s.Claim(ctx, "s", []string{fmt.Sprint(i)}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	last := ""
	cursor := ""
	for pages := 0; ; pages++ {
		recs, next, err := s.List(ctx, stores.ListOptions{Limit: limit, After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.ID <= last || seen[r.ID] {
				t.Fatalf("page %d: ID %s after %s: not in increasing order", pages, r.ID, last)
			}
			seen[r.ID], last = true, r.ID
		}
		if next == "" {
			break
		}
		if len(recs) != limit {
			t.Fatalf("page %d has %d records and a next page", pages, len(recs))
		}
		cursor = next
	}
	if len(seen) != n {
		t.Fatalf("listed %d records, want %d", len(seen), n)
	}
	// Exactly a page's worth: no next page.
	s2, _ := newClocked(t)
	for i := range limit {
		if _, err := s2.Claim(ctx, "s", []string{fmt.Sprint(i)}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if recs, next, err := s2.List(ctx, stores.ListOptions{Limit: limit}); err != nil || len(recs) != limit || next != "" {
		t.Fatalf("a page of exactly Limit records: %d records, next %q, %v; want no next page", len(recs), next, err)
	}
}

// TestStatsBytes: the byte estimate grows with every record and with the
// data a record keeps, and shrinks back when a record and its data go.
func TestStatsBytes(t *testing.T) {
	ctx := context.Background()
	s, _ := newClocked(t)
	bytes := func() int64 {
		t.Helper()
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Bytes
	}
	for i := range 1000 {
		if _, err := s.Claim(ctx, "s", []string{fmt.Sprint(i)}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if b := bytes(); b < 1000*32 {
		t.Fatalf("1000 records take %d bytes, want at least 32 each (a slot)", b)
	}
	a, _ := s.Claim(ctx, "s", []string{"a"}, time.Hour)
	b, _ := s.Claim(ctx, "s", []string{"b"}, time.Hour)
	if err := s.Complete(ctx, a, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	without := bytes()
	data := make([]byte, 1000)
	if err := s.Complete(ctx, b, time.Hour, data); err != nil {
		t.Fatal(err)
	}
	with := bytes()
	// The data's bytes, and its entry: a 16-byte hash and a string header.
	if d := with - without; d < int64(len(data))+32 {
		t.Fatalf("a record's %d bytes of data add %d bytes, want at least %d", len(data), d, len(data)+32)
	}
	if _, err := s.Delete(ctx, "s", "b", stores.StateDone); err != nil {
		t.Fatal(err)
	}
	if after := bytes(); after != without {
		t.Fatalf("after the record with data was deleted: %d bytes, want %d as before it", after, without)
	}
}

// TestDataOfAnEarlierRecordDoesNotSurvive: a record completed with data,
// expired, claimed again and completed without data keeps none: a
// duplicate must not re-emit the outputs of an earlier run.
func TestDataOfAnEarlierRecordDoesNotSurvive(t *testing.T) {
	ctx := context.Background()
	s, clock := newClocked(t)
	c, _ := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err := s.Complete(ctx, c, time.Minute, []byte("first run's outputs")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("claim after the retention: %+v, %v", c, err)
	}
	// Held data kept in the shard while the record is processing is
	// dropped no later than this Complete.
	if err := s.Complete(ctx, c, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	d, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || d.Result != stores.Duplicate || len(d.Data) != 0 {
		t.Fatalf("duplicate %+v, %v; want no data", d, err)
	}
}

// TestExpiredAtItsInstant: a record whose lease or retention ends now is
// expired, for the admin view as for Claim.
func TestExpiredAtItsInstant(t *testing.T) {
	ctx := context.Background()
	s, clock := newClocked(t)
	if _, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	r, err := s.Get(ctx, "s", "k")
	if err != nil || !r.Expired {
		t.Fatalf("Get at the lease's end: %+v, %v; want expired", r, err)
	}
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed || !c.Takeover {
		t.Fatalf("Claim at the lease's end: %+v, %v; want a takeover", c, err)
	}
}

// TestSweepKeepsAnExtendedLease: the longest lease an Extend gave bounds
// how long Sweep keeps an expired processing record, as Claim's does.
func TestSweepKeepsAnExtendedLease(t *testing.T) {
	ctx := context.Background()
	s, clock := newClocked(t)
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, c, time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour + 30*time.Minute) // expired half an hour ago
	if n := s.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d records half an extended lease after it expired", n)
	}
	if c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil || !c.Takeover {
		t.Fatalf("claim after the sweep: %+v, %v; want a takeover", c, err)
	}
}

func TestConfigShardBound(t *testing.T) {
	if _, err := memstore.New(memstore.Config{Shards: 1 << 17}); err == nil {
		t.Fatal("New accepted 2^17 shards, above the bound of 65536")
	}
}
