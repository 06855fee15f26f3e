package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The admin interface beyond the conformance suite (natsstore_test.go
// runs its admin tests): paging through several buckets and pulls,
// records rewritten during a List, a Delete whose record changes under
// it, buckets that keep older revisions, and what Purge keeps.

// listAll pages through s.List with opts and returns every record, and
// how many pages it took.
func listAll(t *testing.T, s *natsstore.Store, opts stores.ListOptions) ([]stores.Record, int) {
	t.Helper()
	var out []stores.Record
	for pages := 1; ; pages++ {
		recs, next, err := s.List(context.Background(), opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		if len(recs) > opts.Limit && opts.Limit > 0 {
			t.Fatalf("List(%+v) returned %d records", opts, len(recs))
		}
		out = append(out, recs...)
		if next == "" {
			return out, pages
		}
		if pages > 10000 {
			t.Fatal("List never ends")
		}
		opts.After = next
	}
}

// consumers is the number of consumers on the streams of cfg's buckets.
func consumers(t *testing.T, nc *nats.Conn, cfg natsstore.Config) int {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range cfg.Buckets() {
		st, err := js.Stream(context.Background(), "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n += info.State.Consumers
	}
	return n
}

// TestAdminListPages: over three buckets and more records than one
// pull carries, every page holds at most its limit, every record is
// listed exactly once (nothing writes meanwhile), the state filter
// holds, and no scan leaves its consumer behind.
func TestAdminListPages(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg := natsstore.Config{Bucket: testBucket(), Shards: 3}
		s := newStore(t, nc, cfg)
		ctx := context.Background()
		const done, processing = 2*natsstore.ScanBatch + 31, 17
		want := map[string]stores.RecordState{}
		for i := range done + processing {
			key := fmt.Sprint("k-", i)
			c := claim(t, s, "s", time.Minute, key)
			if i < done {
				if err := s.Complete(ctx, c, time.Hour, []byte(key)); err != nil {
					t.Fatal(err)
				}
			}
			r, err := s.Get(ctx, "s", key)
			if err != nil {
				t.Fatal(err)
			}
			want[r.ID] = r.State
		}
		// A released key leaves a purge marker, which is no record.
		if err := s.Release(ctx, claim(t, s, "s", time.Minute, "released")); err != nil {
			t.Fatal(err)
		}

		for _, opts := range []stores.ListOptions{
			{Limit: 7}, {Limit: 1}, {Limit: stores.MaxListLimit}, {},
			{State: stores.StateDone, Limit: 50}, {State: stores.StateProcessing, Limit: 5},
		} {
			recs, pages := listAll(t, s, opts)
			seen := map[string]bool{}
			for _, r := range recs {
				st, ok := want[r.ID]
				switch {
				case !ok:
					t.Fatalf("List(%+v) lists %+v, not a record of the test", opts, r)
				case seen[r.ID]:
					t.Fatalf("List(%+v) lists %s twice", opts, r.ID)
				case st != r.State || (opts.State != 0 && r.State != opts.State):
					t.Fatalf("List(%+v) lists %s as %s", opts, r.ID, r.State)
				case r.ScopeKnown || r.KeyKnown:
					t.Fatalf("List reports the scope or key of %+v", r)
				case r.State == stores.StateDone && len(r.Data) == 0:
					t.Fatalf("List lists %s without its data", r.ID)
				}
				seen[r.ID] = true
			}
			n := len(want)
			switch opts.State {
			case stores.StateDone:
				n = done
			case stores.StateProcessing:
				n = processing
			}
			if len(seen) != n {
				t.Fatalf("List(%+v) lists %d records, want %d", opts, len(seen), n)
			}
			if limit := max(opts.Limit, stores.DefaultListLimit); opts.Limit > 0 && opts.Limit < n && pages < n/limit {
				t.Fatalf("List(%+v) took %d pages for %d records", opts, pages, n)
			}
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Done != done || st.Processing != processing || st.Expired != 0 || st.PerScope || st.Bytes <= 0 {
			t.Fatalf("Stats = %+v, want %d done and %d processing", st, done, processing)
		}
		if n := consumers(t, nc, cfg); n != 0 {
			t.Fatalf("%d consumers left on the buckets after the scans", n)
		}
	})
}

// TestAdminListSeesRewrittenRecords: a record written between two pages
// of a List moves to the end of its stream; it is listed (again), in its
// new state, never lost.
func TestAdminListSeesRewrittenRecords(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s := newStore(t, nc, natsstore.Config{Bucket: testBucket()})
		ctx := context.Background()
		claims := map[string]*stores.Claim{}
		for i := range 10 {
			key := fmt.Sprint("k-", i)
			claims[key] = claim(t, s, "s", time.Minute, key)
		}
		first, next, err := s.List(ctx, stores.ListOptions{Limit: 5})
		if err != nil || len(first) != 5 || next == "" {
			t.Fatalf("first page = %d records, %q, %v", len(first), next, err)
		}
		// Every record is completed: those of the first page, and those the
		// next page has not reached yet.
		for _, c := range claims {
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
		}
		rest, _ := listAll(t, s, stores.ListOptions{Limit: 3, After: next})
		done := map[string]bool{}
		for _, r := range rest {
			if r.State != stores.StateDone {
				t.Fatalf("after the rewrite, List lists %+v", r)
			}
			done[r.ID] = true
		}
		if len(done) != 10 {
			t.Fatalf("the pages after the rewrite list %d records, want all 10 done", len(done))
		}
	})
}

// TestAdminDeleteOfAChangingRecord: a Delete whose record changes between
// its read and its write deletes nothing it did not see: the write at the
// revision read fails, and Delete decides again on what it reads then.
func TestAdminDeleteOfAChangingRecord(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s := newStore(t, nc, natsstore.Config{Bucket: testBucket()})
		ctx := context.Background()

		// The owner completes the claim while an operator releases it: the
		// done record is not deleted as a processing one.
		c := claim(t, s, "s", time.Minute, "k")
		s.SetBeforeDelete(func() {
			s.SetBeforeDelete(nil)
			if err := s.Complete(ctx, c, time.Hour, []byte("out")); err != nil {
				t.Errorf("Complete between Delete's read and write: %v", err)
			}
		})
		r, err := s.Delete(ctx, "s", "k", stores.StateProcessing)
		errtest.NotOutage(t, "Delete(processing) of a record completed under it", err, stores.ErrWrongState)
		if r.State != stores.StateDone || string(r.Data) != "out" {
			t.Fatalf("Delete returned %+v, want the done record", r)
		}
		if d := claim(t, s, "s", time.Minute, "k"); d.Result != stores.Duplicate {
			t.Fatalf("after the refused Delete, a Claim is %s", d.Result)
		}

		// A claim extended under the Delete is still processing: deleted at
		// its new revision.
		c = claim(t, s, "s", time.Minute, "e")
		s.SetBeforeDelete(func() {
			s.SetBeforeDelete(nil)
			if err := s.Extend(ctx, c, time.Minute); err != nil {
				t.Errorf("Extend between Delete's read and write: %v", err)
			}
		})
		if r, err := s.Delete(ctx, "s", "e", stores.StateProcessing); err != nil || r.Token != c.Token {
			t.Fatalf("Delete of a claim extended under it = %+v, %v", r, err)
		}
		errtest.Wraps(t, "Extend after the Delete", s.Extend(ctx, c, time.Minute), stores.ErrLostClaim)

		// Gone under it: not found.
		c = claim(t, s, "s", time.Minute, "g")
		s.SetBeforeDelete(func() {
			s.SetBeforeDelete(nil)
			if err := s.Release(ctx, c); err != nil {
				t.Errorf("Release between Delete's read and write: %v", err)
			}
		})
		_, err = s.Delete(ctx, "s", "g", stores.StateProcessing)
		errtest.NotOutage(t, "Delete of a record released under it", err, stores.ErrNotFound)
	})
}

// TestAdminHistoryBucket: in a bucket created with History above 1 (which
// the store uses as it is), the older revisions of a key are no records:
// List and Stats see each key once, in its latest state; under per-key
// TTLs too, where a Release leaves a purge marker.
func TestAdminHistoryBucket(t *testing.T) {
	onServers(t, adminHistoryBucket)
}

func adminHistoryBucket(t *testing.T, nc *nats.Conn) {
	cfg, js := freshBucket(t, nc)
	ctx := context.Background()
	kv := bucketLike(nc, cfg)
	kv.History = 5
	if _, err := js.CreateKeyValue(ctx, kv); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, nc, cfg)
	if want := expectedMode(nc, cfg); s.TTLMode() != want {
		t.Fatalf("the store expires records by %s in a bucket made as it would make it, want %s", s.TTLMode(), want)
	}
	for _, k := range []string{"a", "b", "c"} {
		c := claim(t, s, "s", time.Minute, k)
		if err := s.Extend(ctx, c, time.Minute); err != nil {
			t.Fatal(err)
		}
		if k != "c" {
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Release(ctx, claim(t, s, "s", time.Minute, "r")); err != nil {
		t.Fatal(err)
	}
	recs, _ := listAll(t, s, stores.ListOptions{Limit: 2})
	states := map[string]stores.RecordState{}
	for _, r := range recs {
		if _, dup := states[r.ID]; dup {
			t.Fatalf("List lists %s twice: %+v", r.ID, recs)
		}
		states[r.ID] = r.State
	}
	if len(states) != 3 {
		t.Fatalf("List = %+v, want the 3 keys' latest revisions", recs)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Done != 2 || st.Processing != 1 || st.Expired != 0 {
		t.Fatalf("Stats = %+v, %v; want 2 done, 1 processing", st, err)
	}
}

// TestAdminPurgeKeepsRecentClaims: Purge deletes the done records past
// their retention and the claims whose lease ended more than MaxLease
// ago; it keeps live records and a lapsed claim within MaxLease of its
// end, whose takeover must still be reported.
func TestAdminPurgeKeepsRecentClaims(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		clock := storetest.NewFakeClock(time.Unix(1_900_000_000, 0))
		s := newStore(t, nc, natsstore.Config{Bucket: testBucket(), MaxLease: time.Minute, Clock: clock})
		ctx := context.Background()
		expired := claim(t, s, "s", time.Second, "expired")
		if err := s.Complete(ctx, expired, time.Second, nil); err != nil {
			t.Fatal(err)
		}
		claim(t, s, "s", time.Second, "old-claim")
		clock.Advance(time.Minute)
		claim(t, s, "s", time.Second, "lapsed-claim") // its lease ends 59s before now
		live := claim(t, s, "s", time.Minute, "live")
		if err := s.Complete(ctx, live, time.Hour, nil); err != nil {
			t.Fatal(err)
		}
		claim(t, s, "s", time.Minute, "claimed")
		clock.Advance(time.Minute - time.Second)

		st, err := s.Stats(ctx)
		if err != nil || st.Expired != 3 || st.Done != 1 || st.Processing != 1 {
			t.Fatalf("Stats before Purge = %+v, %v", st, err)
		}
		n, err := s.Purge(ctx)
		if err != nil || n != 2 {
			t.Fatalf("Purge = %d, %v; want the expired done record and the old claim", n, err)
		}
		for key, want := range map[string]bool{"expired": false, "old-claim": false, "lapsed-claim": true, "live": true, "claimed": true} {
			_, err := s.Get(ctx, "s", key)
			if got := err == nil; got != want {
				t.Errorf("after Purge, Get(%q) = %v; want it kept: %v", key, err, want)
			}
		}
		if c := claim(t, s, "s", time.Second, "lapsed-claim"); c.Result != stores.Claimed || !c.Takeover {
			t.Fatalf("the lapsed claim kept by Purge is claimed as %s, takeover %v", c.Result, c.Takeover)
		}
		if n, err := s.Purge(ctx); err != nil || n != 0 {
			t.Fatalf("a second Purge = %d, %v", n, err)
		}
	})
}

// TestAdminForeignValue: a value the store did not write is a fault to
// fix: List and Stats fail naming it, unclassified, and Get too.
func TestAdminForeignValue(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg := natsstore.Config{Bucket: testBucket()}
		s := newStore(t, nc, cfg)
		ctx := context.Background()
		claim(t, s, "s", time.Minute, "ours")
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		key := natsstore.RecordKey("s", "k")
		if _, err := kv.Put(ctx, key, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		_, _, err = s.List(ctx, stores.ListOptions{})
		if err == nil || errors.Is(err, stores.ErrUnavailable) || !strings.Contains(err.Error(), key) {
			t.Fatalf("List of a bucket with a foreign value = %v, want an unclassified error naming %s", err, key)
		}
		if _, err := s.Stats(ctx); err == nil || errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("Stats of a bucket with a foreign value = %v, want an unclassified error", err)
		}
		if _, err := s.Get(ctx, "s", "k"); err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrNotFound) {
			t.Fatalf("Get of a foreign value = %v, want an unclassified error", err)
		}
	})
}

// TestAdminCursor: a cursor names a bucket of the store: one from a
// store with more shards is refused.
func TestAdminCursor(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		three := newStore(t, nc, natsstore.Config{Bucket: testBucket(), Shards: 3})
		one := newStore(t, nc, natsstore.Config{Bucket: testBucket()})
		ctx := context.Background()
		for i := range 20 {
			claim(t, three, "s", time.Minute, fmt.Sprint("k-", i))
		}
		// The buckets are listed one after the other: the 19th record is in
		// the second or third (the keys, and so their buckets, are fixed).
		recs, next, err := three.List(ctx, stores.ListOptions{Limit: 19})
		if err != nil || len(recs) != 19 || next == "" {
			t.Fatalf("List = %d records, %q, %v", len(recs), next, err)
		}
		_, _, err = one.List(ctx, stores.ListOptions{After: next})
		errtest.NotOutage(t, "a cursor of a store with more buckets", err, stores.ErrInvalidArgument)
		if !strings.Contains(fmt.Sprint(err), "bucket") {
			t.Fatalf("the error does not say what is wrong: %v", err)
		}
		rest, next, err := three.List(ctx, stores.ListOptions{After: next, Limit: 5})
		if err != nil || len(rest) != 1 || next != "" {
			t.Fatalf("the last page = %d records, %q, %v", len(rest), next, err)
		}
	})
}

// TestOpen: Open creates no bucket and takes a bucket as it is, whatever
// its MaxAge, for the admin calls.
func TestOpen(t *testing.T) {
	nc := sharedConn(t)
	ctx := context.Background()
	missing := natsstore.Config{Bucket: testBucket()}
	deleteBuckets(t, nc, missing)
	_, err := natsstore.Open(ctx, nc, missing)
	errtest.NotOutage(t, "Open of a missing bucket", err, natsstore.ErrNoBucket)
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(ctx, "KV_"+missing.Bucket); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Open created the bucket, or: %v", err)
	}
	if _, err := natsstore.Open(ctx, nil, missing); err == nil {
		t.Fatal("Open accepted a nil connection")
	}

	// A store of an hour's retention; the default config needs a day.
	short := natsstore.Config{Bucket: testBucket(), MaxLease: time.Minute, MaxRetention: time.Hour}
	s := newStore(t, nc, short)
	c := claim(t, s, "s", time.Minute, "k")
	if err := s.Complete(ctx, c, time.Hour, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := natsstore.New(ctx, nc, natsstore.Config{Bucket: short.Bucket}); !errors.Is(err, natsstore.ErrBucketConfig) {
		t.Fatalf("New with the default config on the short bucket = %v", err)
	}
	a, err := natsstore.Open(ctx, nc, natsstore.Config{Bucket: short.Bucket})
	if err != nil {
		t.Fatalf("Open of a bucket with a shorter MaxAge: %v", err)
	}
	defer a.Close(ctx)
	if r, err := a.Get(ctx, "s", "k"); err != nil || string(r.Data) != "x" {
		t.Fatalf("Get through Open = %+v, %v", r, err)
	}
}
