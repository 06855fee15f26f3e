package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// No record is taken for router_example's bookkeeping (#7). Under
// Redis's default prefix, dedupctl passed over every key that looked
// like a run's (dedup:<run id>:loyalty…): the record of scope "points"
// and key "loyalty:42" was missing from list, counted as skipped by
// stats and named as "router_example run -run-id=points", and forget
// -prefix could not reach it. On every store, under the name dedupctl
// reads when none is given where the test can own it (Redis on a server
// of its own, a Redis Cluster of its own), every record is listed,
// counted, and reached by forget.
func TestRecordsThatLookLikeExampleRuns(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		var tg *target
		switch kind {
		case anystore.StoreRedis:
			e.redis = redistest.StartRedis(t)
			tg = e.open(t, kind, redisstore.DefaultPrefix)
		case anystore.StoreRedisCluster:
			tg = e.open(t, kind, redisstore.DefaultPrefix)
		default:
			// No default name is special there: a table or bucket of
			// the test's own.
			tg = e.open(t, kind, "")
		}
		type rec struct{ scope, key string }
		lookalikes := []rec{{"points", "loyalty:42"}, {"points", "loyalty=7"}, {"points", "loyalty#x"}}
		all := append(slices.Clone(lookalikes), rec{"points", "other"}, rec{"loyalty", "payment:PAY-points-evt-000001"})
		for _, r := range all {
			tg.done(t, r.scope, r.key)
		}

		var st statsJSON
		r := tg.run(t, "stats", "-json").want(t, exitOK)
		r.json(t, &st)
		if st.Done != int64(len(all)) || st.Total != int64(len(all)) || st.Skipped != 0 {
			t.Fatalf("stats -json counts %d done of %d records, %d skipped; want all, none skipped:\n%s", st.Done, len(all), st.Skipped, r.stdout)
		}
		if tg.scopes {
			i := slices.IndexFunc(st.Scopes, func(s scopeJSON) bool { return s.Scope == "points" })
			if i < 0 || st.Scopes[i].Done != 4 {
				t.Fatalf("stats -json scopes = %+v, want 4 done records in scope points", st.Scopes)
			}
		}
		r = tg.run(t, "stats").want(t, exitOK)
		if strings.Contains(r.stdout, "router_example") || strings.Contains(r.stdout, "skipped") {
			t.Fatalf("stats takes records for a router_example run's keys:\n%s", r)
		}

		var page struct {
			Records []recordJSON `json:"records"`
			Next    string       `json:"next"`
		}
		r = tg.run(t, "list", "-json", "-limit=1000").want(t, exitOK)
		r.json(t, &page)
		if len(page.Records) != len(all) || page.Next != "" {
			t.Fatalf("list shows %d of the %d records:\n%s", len(page.Records), len(all), r.stdout)
		}
		r = tg.run(t, "list", "-limit=1000").want(t, exitOK)
		if n := recordRows(r.stdout); n != len(all) || strings.Contains(r.stdout, "router_example") {
			t.Fatalf("list shows %d rows of the %d records:\n%s", n, len(all), r)
		}

		if tg.scopes {
			var res removeResult
			tg.run(t, "forget", "points", "-prefix=loyalty", "-all", "-yes", "-json").want(t, exitOK).json(t, &res)
			if len(res.Deleted) != len(lookalikes) {
				t.Fatalf("forget -prefix=loyalty deleted %d records, want the %d in scope points:\n%+v", len(res.Deleted), len(lookalikes), res)
			}
		} else {
			for _, l := range lookalikes {
				tg.run(t, "forget", l.scope, l.key, "-yes").want(t, exitOK, "stdout:forgot")
			}
		}
		st = statsJSON{}
		tg.run(t, "stats", "-json").want(t, exitOK).json(t, &st)
		if want := int64(len(all) - len(lookalikes)); st.Total != want || st.Skipped != 0 {
			t.Fatalf("after forget: stats -json counts %d records, %d skipped; want %d, none", st.Total, st.Skipped, want)
		}
	})
}
