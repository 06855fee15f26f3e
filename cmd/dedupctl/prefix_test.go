package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
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

// innerRecords writes records under the prefix "dedup:<id>:", inside
// the default "dedup:", as another store with that prefix does (and
// router_example's runs did before #7) in scope loyalty: a payment key,
// and message ids packed as UUIDs, one of whose bytes are '%' and '{' (a
// key the default prefix's layout would have escaped). It returns their
// keys.
func innerRecords(t *testing.T, client redis.UniversalClient, id string) []string {
	t.Helper()
	prefix := "dedup:" + id + ":"
	t.Cleanup(func() { _ = redisclean.DeletePrefix(context.Background(), client, prefix) })
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, SkipServerCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	keys := []string{
		"payment:PAY-" + id + "-evt-000001",
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
	return keys
}

// Under the default prefix "dedup:", the keys of a store with a longer
// one ("dedup:<id>:") are read as the default layout reads them, whatever
// they look like: stats failed on a key that layout does not write, and
// list printed the packed message ids' raw bytes (#23); then, for
// router_example's runs, dedupctl guessed which keys were a run's and
// passed over real records that looked like them (#7). A key that
// decodes is a record, of the scope "<id>"; one that does not (the
// message id holding '%' and '{'), or a value the store does not write,
// is skipped and counted; no output holds a raw byte. The longer prefix
// reads them as its records. On a redis-server of the test's own: the
// shared one holds other programs' keys under "dedup:".
func TestLongerPrefixInsideDefaultPrefix(t *testing.T) {
	addr := redistest.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	id := storetest.NewID()[:8]
	keys := innerRecords(t, client, id)
	// A key under "dedup:" in no layout of the store's, holding a value
	// it does not write.
	foreign := "dedup:foreign-" + storetest.NewID() + ":%zz"
	if err := client.Set(t.Context(), foreign, "not a record", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	base := []string{"-store=redis", "-redis-addr=" + addr}

	r := dedupctl(t, append(base, "stats")...).want(t, exitOK, `stdout:"`+id+`"`, "stdout:skipped 2 keys")
	if !ascii(r.stdout) || !ascii(r.stderr) || strings.Contains(r.stdout, "router_example") {
		t.Fatalf("stats prints raw bytes, or names a router_example run: %q", r.stdout)
	}
	var st statsJSON
	dedupctl(t, append(base, "stats", "-json")...).want(t, exitOK).json(t, &st)
	if st.Done != 2 || st.Skipped != 2 || len(st.Scopes) != 1 || st.Scopes[0].Scope != id || st.Scopes[0].Done != 2 {
		t.Fatalf("stats -json = %+v, want the 2 records that decode in scope %s, the 2 other keys skipped", st, id)
	}

	var page struct {
		Records []recordJSON `json:"records"`
	}
	dedupctl(t, append(base, "list", "-json")...).want(t, exitOK).json(t, &page)
	if len(page.Records) != 2 {
		t.Fatalf("list -json shows %d records, want 2: %+v", len(page.Records), page.Records)
	}
	for _, args := range [][]string{{"list"}, {"list", id}} {
		r = dedupctl(t, append(base, args...)...).want(t, exitOK, `stdout:"loyalty:payment:PAY-`+id+`-evt-000001"`)
		if !ascii(r.stdout) || recordRows(r.stdout) != 2 {
			t.Fatalf("%v prints raw bytes, or not the 2 records: %s", args, r)
		}
	}
	dedupctl(t, append(base, "get", id, "loyalty:payment:PAY-"+id+"-evt-000001")...).want(t, exitOK).field(t, "state", "done")

	// The longer prefix: its records, keys readable, ids escaped.
	inner := append(slices.Clone(base), "-redis-prefix=dedup:"+id+":")
	r = dedupctl(t, append(inner, "list", "loyalty")...).want(t, exitOK,
		`stdout:"payment:PAY-`+id+`-evt-000001"`, `stdout:"msg:25257b7b-0000-4000-8000-00000000007b"`)
	if !ascii(r.stdout) || recordRows(r.stdout) != len(keys) {
		t.Fatalf("list -redis-prefix prints raw bytes, or not the %d records: %s", len(keys), r)
	}
	st = statsJSON{}
	dedupctl(t, append(inner, "stats", "-json")...).want(t, exitOK).json(t, &st)
	if st.Done != int64(len(keys)) || st.Skipped != 0 || len(st.Scopes) != 1 || st.Scopes[0].Scope != "loyalty" {
		t.Fatalf("stats -redis-prefix -json = %+v", st)
	}
}

// A key or scope that is not printable ASCII is quoted with escapes in
// every table, its id as redis-cli shows it.
func TestUnprintableKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		if kind != anystore.StoreRedis {
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
