package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestAdminPages lists and counts more records than one SCAN returns
// (the admin SCANs ask for 1000 keys at a time), in pages that end in the
// middle of a SCAN's batch.
func TestAdminPages(t *testing.T) {
	testAdminPages(t, sharedRedis(t))
}

func testAdminPages(t *testing.T, client redis.UniversalClient) {
	ctx := context.Background()
	s := newStore(t, client, redisstore.Config{})
	keys := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = prefix + strconv.Itoa(i)
		}
		return out
	}
	if err := s.WriteDone(ctx, "s", keys("k", 2500), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteDone(ctx, "t", keys("k", 500), time.Hour); err != nil {
		t.Fatal(err)
	}

	list := func(opts stores.ListOptions) map[string]stores.Record {
		t.Helper()
		out := map[string]stores.Record{}
		for {
			recs, next, err := s.List(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > opts.Limit {
				t.Fatalf("a page of %d records, limit %d", len(recs), opts.Limit)
			}
			for _, r := range recs {
				if opts.Scope != "" && r.Scope != opts.Scope {
					t.Fatalf("List(scope %q) lists %+v", opts.Scope, r)
				}
				out[r.Scope+"/"+r.Key] = r
			}
			if next == "" {
				return out
			}
			opts.After = next
		}
	}
	if got := list(stores.ListOptions{Limit: 999}); len(got) != 3000 {
		t.Fatalf("List in pages of 999 found %d records, want 3000", len(got))
	}
	if got := list(stores.ListOptions{Scope: "s", Limit: 333}); len(got) != 2500 {
		t.Fatalf("List(scope s) in pages of 333 found %d records, want 2500", len(got))
	}
	if got := list(stores.ListOptions{Scope: "t", KeyPrefix: "k1", Limit: 7}); len(got) != 111 {
		t.Fatalf("List(scope t, key prefix k1) found %d records, want 111", len(got))
	}

	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Done != 3000 || st.Processing != 0 || st.Expired != 0 || len(st.Scopes) != 2 ||
		st.Scopes[0] != (stores.ScopeStats{Scope: "s", Counts: stores.Counts{Done: 2500}, OldestExpiry: st.Scopes[0].OldestExpiry, NewestExpiry: st.Scopes[0].NewestExpiry}) ||
		st.Scopes[1].Scope != "t" || st.Scopes[1].Done != 500 {
		t.Fatalf("Stats = %+v", st)
	}
	// A done record takes about a hundred bytes (README.md).
	if per := st.Bytes / 3000; per < 50 || per > 400 {
		t.Fatalf("Stats.Bytes = %d: %d bytes a record", st.Bytes, per)
	}
}
