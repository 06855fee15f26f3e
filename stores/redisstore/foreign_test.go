package redisstore_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

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
