package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

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
