package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
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

// Keys under the prefix that are not the store's records (another
// layout's, another program's value, no expiry, those Config.Foreign
// names) are passed over by List and Stats, which counts them in
// Skipped: they fail neither (#23; Stats failed on the first such key).
func TestAdminSkipsForeignKeys(t *testing.T) {
	c := sharedRedis(t)
	prefix := testPrefix(t, c)
	nested := prefix + "run1:"
	s, err := redisstore.New(c, redisstore.Config{
		Prefix:          prefix,
		SkipServerCheck: true,
		Foreign:         func(k string) bool { return strings.HasPrefix(k, nested) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	ctx := t.Context()
	for _, k := range []string{"a", "b"} {
		cl, err := s.Claim(ctx, "scope", []string{k}, time.Minute)
		if err != nil || cl.Result != stores.Claimed {
			t.Fatalf("Claim: %+v, %v", cl, err)
		}
		if k == "a" {
			if err := s.Complete(ctx, cl, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Under the prefix, none of them a record of the store.
	foreign := map[string]time.Duration{
		prefix + "scope:%zz":     time.Hour, // a malformed escape: no key of the layout
		prefix + "scope:{x":      time.Hour, // an unescaped '{'
		prefix + "scope:value":   time.Hour, // the layout's, with a value the store never writes
		prefix + "scope:forever": 0,         // no expiry
		nested + "scope:a":       time.Hour, // Foreign's
	}
	for k, ttl := range foreign {
		v := "not a record"
		if k == nested+"scope:a" || k == prefix+"scope:forever" {
			v = "1" // a done record's value
		}
		if err := c.Set(ctx, k, v, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}

	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.Processing != 1 || st.Done != 1 || st.Skipped != int64(len(foreign)) || len(st.SkippedSample) != len(foreign) {
		t.Fatalf("Stats = %+v, want 1 processing, 1 done and the %d foreign keys skipped", st, len(foreign))
	}
	if len(st.Scopes) != 1 || st.Scopes[0].Scope != "scope" || st.Scopes[0].Total() != 2 {
		t.Fatalf("Stats.Scopes = %+v", st.Scopes)
	}
	for k := range foreign {
		if !slices.Contains(st.SkippedSample, k) { // printable ASCII: written as it is
			t.Fatalf("Stats.SkippedSample = %q lacks %q", st.SkippedSample, k)
		}
	}
	for _, opts := range []stores.ListOptions{{}, {Limit: 1}, {Scope: "scope"}, {Scope: "scope", Limit: 1}} {
		var ids []string
		for {
			recs, next, err := s.List(ctx, opts)
			if err != nil {
				t.Fatalf("List(%+v): %v", opts, err)
			}
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if next == "" {
				break
			}
			opts.After = next
		}
		slices.Sort(ids)
		if want := []string{prefix + "scope:a", prefix + "scope:b"}; !slices.Equal(ids, want) {
			t.Fatalf("List(%+v) = %q, want %q", opts, ids, want)
		}
	}
	// Neither is reached by its id.
	for k := range foreign {
		if strings.HasPrefix(k, nested) {
			continue // a key of the layout: Foreign is the admin scans' only
		}
		if _, err := s.GetByID(ctx, k); err == nil {
			t.Fatalf("GetByID(%q) found a record", k)
		}
	}
}

// TestListWhileTheKeyspaceChanges lists records in small pages on a Redis
// Cluster of its own while other keys come and go between the pages, as
// they do on any server in use (and as expiries and resizes do on an idle
// one): the nodes' hash tables grow, shrink and rehash, which reorders
// the keys a SCAN cursor returns. Every record must be listed, whatever
// the page size; a record listed twice is allowed (SCAN's own rule).
func TestListWhileTheKeyspaceChanges(t *testing.T) {
	cc := startCluster(t)
	ctx := context.Background()
	s := newStore(t, cc, redisstore.Config{})
	const records = 120
	want := map[string]bool{}
	var keys []string
	for i := range records {
		k := "k-" + strconv.Itoa(i)
		keys = append(keys, k)
		want[k] = true
	}
	if err := s.WriteDone(ctx, "s", keys, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Neighbours the scope's pattern leaves out: they share the nodes'
	// tables, and the SCAN batches, with the scope's records.
	if err := s.WriteDone(ctx, "s-other", keys, time.Hour); err != nil {
		t.Fatal(err)
	}

	other := "dedup-test-churn-" + storetest.NewID() + ":"
	t.Cleanup(func() { deletePrefix(t, cc, other) })
	round := 0
	// churn writes, then deletes, keys of another program on every node,
	// so that every node's table grows and then shrinks.
	churn := func() {
		t.Helper()
		round++
		n := 200 + 150*(round%7)
		if _, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range n {
				p.Set(ctx, other+strconv.Itoa(round)+":"+strconv.Itoa(i), "x", time.Hour)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if round%2 == 0 {
			return
		}
		deletePrefix(t, cc, other)
	}

	for _, limit := range []int{1, 2, 3, 5, 7} {
		for _, opts := range []stores.ListOptions{{Scope: "s", Limit: limit}, {Limit: limit}} {
			listed := map[string]bool{}
			for pages := 0; ; pages++ {
				if pages > 10*records {
					t.Fatalf("List(%+v): more than %d pages", opts, 10*records)
				}
				recs, next, err := s.List(ctx, opts)
				if err != nil {
					t.Fatalf("List(%+v): %v", opts, err)
				}
				if len(recs) > limit {
					t.Fatalf("List(%+v): a page of %d records", opts, len(recs))
				}
				for _, r := range recs {
					if r.Scope == "s" {
						listed[r.Key] = true
					}
				}
				if next == "" {
					break
				}
				opts.After = next
				churn()
			}
			var missed []string
			for k := range want {
				if !listed[k] {
					missed = append(missed, k)
				}
			}
			if len(missed) > 0 {
				opts.After = ""
				t.Errorf("List(%+v) in pages while the keyspace changed missed %d of %d records: %v", opts, len(missed), records, missed)
			}
		}
	}
}

// TestListCursorKeysAreFiltered: the keys a cursor carries (what the last
// SCAN reply held beyond its page) are listed only when they are records
// the List selects, like the keys a SCAN returns: a cursor is text its
// caller hands back, and may have been made by another List or by hand.
func TestListCursorKeysAreFiltered(t *testing.T) {
	c := newClient(t, startRedis(t))
	ctx := context.Background()
	s := newStore(t, c, redisstore.Config{})
	for _, r := range []struct{ scope, key string }{{"secret", "k1"}, {"b", "x"}, {"b", "y-1"}} {
		if err := s.WriteDone(ctx, r.scope, []string{r.key}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if cl, err := s.Claim(ctx, "b", []string{"y-2"}, time.Hour); err != nil || cl.Result != stores.Claimed {
		t.Fatal(cl, err)
	}
	pending := []string{s.EncodeKey("secret", "k1"), s.EncodeKey("b", "x"), s.EncodeKey("b", "y-1"), s.EncodeKey("b", "y-2"), "another-program:key"}
	cur := redisstore.ListCursor(c.Options().Addr, 0, pending...)
	for _, opts := range []stores.ListOptions{
		{Scope: "b"},
		{Scope: "b", KeyPrefix: "y-"},
		{Scope: "b", State: stores.StateProcessing},
		{State: stores.StateDone},
	} {
		opts.Limit, opts.After = 10, cur
		recs, _, err := s.List(ctx, opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.Scope+"/"+r.Key)
			if opts.Scope != "" && r.Scope != opts.Scope || opts.State != 0 && r.State != opts.State || !strings.HasPrefix(r.Key, opts.KeyPrefix) {
				t.Errorf("List(%+v) with a cursor carrying keys of other scopes returned %s/%s (%v), which it does not select", opts, r.Scope, r.Key, r.State)
			}
		}
		t.Logf("List(%+v): %v", opts, got)
	}
}
