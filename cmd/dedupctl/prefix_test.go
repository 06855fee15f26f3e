package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
	"github.com/watermill-dedup/dedup/testkit"
)

// ascii reports whether s holds printable ASCII and newlines only.
func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 || c >= 0x7f) && c != '\n' && c != '\t' {
			return false
		}
	}
	return true
}

// runRecords writes, as router_example does, records under the prefix
// "dedup:<run id>:" (inside dedupctl's default "dedup:") in scope
// loyalty: a payment key, and message ids packed as UUIDs, one of whose
// bytes are '%' and '{' (a key the default prefix's layout would have
// escaped). It returns the number of records.
func runRecords(t *testing.T, client redis.UniversalClient, runID string) int {
	t.Helper()
	prefix := "dedup:" + runID + ":"
	t.Cleanup(func() { _ = storeopen.DeleteRedisPrefix(context.Background(), client, prefix) })
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, SkipServerCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	keys := []string{
		"payment:PAY-" + runID + "-evt-000001",
		"msg:25257b7b-0000-4000-8000-00000000007b",
		"msg:0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c",
	}
	for _, k := range keys {
		c, err := s.Claim(t.Context(), "loyalty", []string{k}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim: %+v, %v", c, err)
		}
		if err := s.Complete(t.Context(), c, time.Hour, nil); err != nil {
			t.Fatal(err)
		}
	}
	return len(keys)
}

// The README's sequence, router_example -store=redis then dedupctl
// -store=redis stats, ran into the run's records under "dedup:<run
// id>:", inside the default prefix "dedup:": stats failed on a key the
// default layout does not write, and list took the run id for a scope
// and printed the packed message ids' raw bytes (#23). Keys that are not
// the store's records are skipped and counted, a run's with the
// -run-id that reaches them, and no output holds a raw byte.
func TestExampleRunUnderDefaultPrefix(t *testing.T) {
	addr := testkit.RequireRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	runID := storetest.NewID()[:8]
	n := runRecords(t, client, runID)
	// A key under "dedup:" in no layout of the store's, holding a value
	// it does not write.
	foreign := "dedup:foreign-" + storetest.NewID() + ":%zz"
	if err := client.Set(t.Context(), foreign, "not a record", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Del(context.Background(), foreign) })
	base := []string{"-store=redis", "-redis-addr=" + addr}

	r := dedupctl(t, append(base, "stats")...).want(t, exitOK, "stdout:"+runID, "stdout:-run-id="+runID, "stdout:skipped")
	if !ascii(r.stdout) || !ascii(r.stderr) {
		t.Fatalf("stats prints raw bytes: %q", r.stdout)
	}
	var st statsJSON
	dedupctl(t, append(base, "stats", "-json")...).want(t, exitOK).json(t, &st)
	if st.Skipped < int64(n)+1 {
		t.Fatalf("stats -json skipped %d keys, want at least the run's %d and the foreign one: %+v", st.Skipped, n, st)
	}
	if i := slices.IndexFunc(st.SkippedRuns, func(r skippedRun) bool { return r.RunID == runID }); i < 0 || st.SkippedRuns[i].Keys != int64(n) {
		t.Fatalf("stats -json skipped runs = %+v, want run %s with %d keys", st.SkippedRuns, runID, n)
	}
	for _, sc := range st.Scopes {
		if sc.Scope == runID {
			t.Fatalf("stats counts the run id %s as a scope: %+v", runID, st.Scopes)
		}
	}

	// Every page of list: no record of the run, no raw byte.
	after := ""
	for {
		a := append(base, "list", "-json", "-limit=1000")
		if after != "" {
			a = append(a, "-after="+after)
		}
		var page struct {
			Records []recordJSON `json:"records"`
			Next    string       `json:"next"`
		}
		tg := dedupctl(t, a...).want(t, exitOK)
		tg.json(t, &page)
		for _, rec := range page.Records {
			if deref(rec.Scope) == runID || strings.Contains(rec.ID, runID) {
				t.Fatalf("list shows a record of run %s: %+v", runID, rec)
			}
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	r = dedupctl(t, append(base, "list", "-limit=10000")...).want(t, exitOK)
	if !ascii(r.stdout) || strings.Contains(r.stdout, `"`+runID+`"`) {
		t.Fatalf("list shows the run's records or raw bytes: %s", r)
	}

	// -run-id reaches them, keys readable, ids escaped.
	r = dedupctl(t, append(base, "-run-id="+runID, "list", "loyalty")...).want(t, exitOK,
		`stdout:"payment:PAY-`+runID+`-evt-000001"`, `stdout:"msg:25257b7b-0000-4000-8000-00000000007b"`)
	if !ascii(r.stdout) {
		t.Fatalf("list -run-id prints raw bytes: %s", r)
	}
	st = statsJSON{}
	dedupctl(t, append(base, "-run-id="+runID, "stats", "-json")...).want(t, exitOK).json(t, &st)
	if st.Done != int64(n) || st.Skipped != 0 || len(st.Scopes) != 1 || st.Scopes[0].Scope != "loyalty" {
		t.Fatalf("stats -run-id -json = %+v", st)
	}
	// An explicit -redis-prefix=dedup: reads the keys as the store with
	// that prefix would: the run's are scopes then, its undecodable key
	// skipped, and still no raw byte.
	r = dedupctl(t, append(base, "-redis-prefix=dedup:", "list", runID)...).want(t, exitOK)
	if !ascii(r.stdout) {
		t.Fatalf("list -redis-prefix=dedup: prints raw bytes: %s", r)
	}
}

// A key or scope that is not printable ASCII is quoted with escapes in
// every table, its id as redis-cli shows it.
func TestUnprintableKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind testkit.StoreKind) {
		if kind != testkit.StoreRedis {
			return // the other layouts print no key in a listing
		}
		tg := e.open(t, kind, "")
		scope := "s-" + storetest.NewID()
		key := "k\u036e\xf9\xa2\x00"
		tg.done(t, scope, key)
		for _, args := range [][]string{{"list", scope}, {"get", scope, key}, {"stats"}, {"forget", scope, key}} {
			r := tg.run(t, args...)
			if r.code != exitOK && r.code != exitRefused {
				t.Fatalf("%v: %s", args, r)
			}
			if !ascii(r.stdout) || !ascii(r.stderr) {
				t.Fatalf("%v prints raw bytes: %q", args, r.stdout)
			}
			if args[0] != "stats" && !strings.Contains(r.stdout, `\u036e\xf9\xa2\x00`) {
				t.Fatalf("%v does not show the key escaped: %s", args, r)
			}
		}
	})
}
