package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// deref is *s, "?" for nil.
func deref(s *string) string {
	if s == nil {
		return "?"
	}
	return *s
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.code) + "\nstdout:\n" + r.stdout + "stderr:\n" + r.stderr
}

// dedupctl runs the command with args in an empty environment.
func dedupctl(t *testing.T, args ...string) result {
	t.Helper()
	return dedupctlEnv(t, nil, args...)
}

func dedupctlEnv(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), args, &stdout, &stderr, func(k string) string { return env[k] })
	return result{code, stdout.String(), stderr.String()}
}

// want checks the exit status, and that stdout and stderr hold the texts
// given as "stdout:..." and "stderr:...".
func (r result) want(t *testing.T, code int, texts ...string) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	for _, s := range texts {
		where, text, _ := strings.Cut(s, ":")
		out := r.stdout
		if where == "stderr" {
			out = r.stderr
		}
		if !strings.Contains(out, text) {
			t.Fatalf("%s lacks %q: %s", where, text, r)
		}
	}
	return r
}

func (r result) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not the JSON expected: %v\n%s", err, r)
	}
}

// target is a store of one kind, a table or prefix of its own, with the
// flags that point dedupctl at it.
type target struct {
	kind   anystore.StoreKind
	store  stores.Store
	admin  stores.Admin
	opened *anystore.OpenedStore
	args   []string
	// scopes: the layout keeps scopes (Redis's default layout).
	scopes bool
}

// cluster is the Redis Cluster of the redis-cluster targets, started once
// per test that asks for it.
type env struct {
	cluster []string
	// redis, when set, is a redis-server of the test's own that the
	// redis targets use instead of the shared one.
	redis string
}

var kinds = []anystore.StoreKind{anystore.StoreRedis, anystore.StoreRedisCluster, anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreSQLite, anystore.StoreNATS}

// forEachStore runs fn on a store of every kind dedupctl reaches.
func forEachStore(t *testing.T, fn func(t *testing.T, e *env, kind anystore.StoreKind)) {
	e := &env{}
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			if kind == anystore.StoreRedisCluster && e.cluster == nil {
				e.cluster = redistest.StartRedisCluster(t)
			}
			fn(t, e, kind)
		})
	}
}

// open opens a store of kind with a name of its own (name "" for a
// random one), deleted when t ends.
func (e *env) open(t *testing.T, kind anystore.StoreKind, name string) *target {
	t.Helper()
	p := anystore.StoreParams{Kind: kind, Name: name, CreateSchema: true, Teardown: true, Redis: redisstore.Config{SkipServerCheck: true}}
	tg := &target{kind: kind}
	switch kind {
	case anystore.StoreRedis:
		p.Addr = e.redis
		if p.Addr == "" {
			p.Addr = testkit.RequireRedis(t)
		}
		tg.args = []string{"-store=redis", "-redis-addr=" + p.Addr}
		tg.scopes = true
	case anystore.StoreRedisCluster:
		p.Addr = strings.Join(e.cluster, ",")
		tg.args = []string{"-store=redis", "-redis-cluster", "-redis-addr=" + p.Addr}
		tg.scopes = true
	case anystore.StorePostgres:
		tg.args = []string{"-store=postgres", "-postgres-dsn=" + testkit.RequirePostgres(t)}
	case anystore.StoreMySQL:
		tg.args = []string{"-store=mysql", "-mysql-dsn=" + testkit.RequireMySQL(t)}
	case anystore.StoreSQLite:
		p.Path = filepath.Join(t.TempDir(), "dedup.db")
		tg.args = []string{"-store=sqlite", "-sqlite-file=" + p.Path}
	case anystore.StoreNATS:
		p.Addr = anystore.RequireStore(t, kind)
		tg.args = []string{"-store=nats", "-nats-url=nats://" + p.Addr}
	}
	o, closeStore, err := anystore.OpenStore(context.Background(), p)
	if err != nil {
		t.Fatalf("open the %s store: %v", kind, err)
	}
	t.Cleanup(func() {
		if err := closeStore(context.Background()); err != nil {
			t.Errorf("closing the %s store: %v", kind, err)
		}
	})
	if name == "" {
		switch {
		case o.Redis != nil:
			tg.args = append(tg.args, "-redis-prefix="+o.Name)
		case o.NATS != nil:
			tg.args = append(tg.args, "-nats-bucket="+o.Name)
		default:
			tg.args = append(tg.args, "-table="+o.Name)
		}
	}
	tg.store, tg.admin, tg.opened = o.Store, o.Store.(stores.Admin), o
	return tg
}

// run runs dedupctl on the target.
func (tg *target) run(t *testing.T, args ...string) result {
	t.Helper()
	return dedupctl(t, append(append([]string{}, tg.args...), args...)...)
}

func (tg *target) claim(t *testing.T, scope, key string, lease time.Duration) *stores.Claim {
	t.Helper()
	c, err := tg.store.Claim(t.Context(), scope, []string{key}, lease)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(%q, %q) = %+v, %v", scope, key, c, err)
	}
	return c
}

func (tg *target) done(t *testing.T, scope, key string) {
	t.Helper()
	if err := tg.store.Complete(t.Context(), tg.claim(t, scope, key, time.Minute), time.Hour, nil); err != nil {
		t.Fatal(err)
	}
}

// seed makes a scope of its own on the target, with key p1 claimed for a
// minute (the claim returned) and key d1 done.
func (tg *target) seed(t *testing.T) (scope string, c *stores.Claim) {
	t.Helper()
	scope = "dedupctl-" + storetest.NewID()
	c = tg.claim(t, scope, "p1", time.Minute)
	tg.done(t, scope, "d1")
	return scope, c
}

// result is what a Claim of (scope, key) finds; a Claimed key is
// released again.
func (tg *target) result(t *testing.T, scope, key string) stores.Result {
	t.Helper()
	c, err := tg.store.Claim(t.Context(), scope, []string{key}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c.Result == stores.Claimed {
		if err := tg.store.Release(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	return c.Result
}

// handled runs msg through the dedup middleware in scope, with the
// payload fingerprint on and a handler that produces two messages: a
// done record with a fingerprint and two stored outputs.
func (tg *target) handled(t *testing.T, scope string, msg *message.Message) {
	t.Helper()
	mw, err := middleware.New(middleware.Config{
		Store: tg.store, Scope: scope, Policy: dedup.Policy{Retention: time.Hour, Logger: watermill.NopLogger{}}, Fingerprint: middleware.PayloadFingerprint})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-1", []byte("a")), message.NewMessage("out-2", []byte("b"))}, nil
	})
	if out, err := h(msg); err != nil || len(out) != 2 {
		t.Fatalf("handler through the middleware: %d outputs, %v", len(out), err)
	}
	if err := mw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

var fieldLine = func(name, value string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+` + regexp.QuoteMeta(value) + `(\s|$)`)
}

func (r result) field(t *testing.T, name, value string) {
	t.Helper()
	if !fieldLine(name, value).MatchString(r.stdout) {
		t.Fatalf("no line %q %q in %s", name, value, r)
	}
}

func TestGetAndList(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope, c := tg.seed(t)
		msg := message.NewMessage("m-"+storetest.NewID(), []byte(`{"payment_id":"PAY-1"}`))
		tg.handled(t, scope, msg)

		// get, as a table and as JSON.
		r := tg.run(t, "get", scope, "p1").want(t, exitOK)
		r.field(t, "state", "processing")
		r.field(t, "token", c.Token)
		r.field(t, "scope", strconv.Quote(scope))
		r = tg.run(t, "get", scope, msg.UUID).want(t, exitOK)
		fp := hex.EncodeToString(middleware.PayloadFingerprint(msg))
		r.field(t, "state", "done")
		r.field(t, "fingerprint", fp)
		r.field(t, "outputs", "2")
		var got recordJSON
		tg.run(t, "get", "-json", scope, msg.UUID).want(t, exitOK).json(t, &got)
		if got.State != "done" || got.Fingerprint != fp || got.Outputs == nil || *got.Outputs != 2 || got.ExpiresAt == nil ||
			deref(got.Scope) != scope || deref(got.Key) != msg.UUID || got.Expired {
			t.Fatalf("get -json = %+v", got)
		}
		got = recordJSON{}
		tg.run(t, "get", "-json", scope, "p1").want(t, exitOK).json(t, &got)
		if got.State != "processing" || got.Token != c.Token || got.LeaseUntil == nil || got.Outputs != nil {
			t.Fatalf("get -json of a processing record = %+v", got)
		}
		tg.run(t, "get", scope, "nope").want(t, exitNotFound, `stderr:no record for key "nope" in scope "`+scope+`"`)
		tg.run(t, "get", scope+"-other", "d1").want(t, exitNotFound)

		ids := map[string]string{} // key -> ID
		for _, k := range []string{"p1", "d1", msg.UUID} {
			rec, err := tg.admin.Get(t.Context(), scope, k)
			if err != nil {
				t.Fatal(err)
			}
			ids[k] = rec.ID
		}
		// list, every page of it.
		listed := func(args ...string) map[string]recordJSON {
			t.Helper()
			out := map[string]recordJSON{}
			after := ""
			for {
				a := append([]string{"list", "-json", "-limit=1"}, args...)
				if after != "" {
					a = append(a, "-after="+after)
				}
				var page struct {
					Records []recordJSON `json:"records"`
					Next    string       `json:"next"`
				}
				tg.run(t, a...).want(t, exitOK).json(t, &page)
				if len(page.Records) > 1 {
					t.Fatalf("list -limit=1 printed %d records", len(page.Records))
				}
				for _, r := range page.Records {
					out[r.ID] = r
				}
				if page.Next == "" {
					return out
				}
				after = page.Next
			}
		}
		all := listed()
		for k, id := range ids {
			if _, ok := all[id]; !ok {
				t.Fatalf("list does not show %q (id %s)", k, id)
			}
		}
		if r := all[ids["p1"]]; r.State != "processing" || r.Token != c.Token {
			t.Fatalf("list shows %+v for p1", r)
		}
		done := listed("-state=done")
		if _, ok := done[ids["p1"]]; ok || len(done) < 2 {
			t.Fatalf("list -state=done = %+v", done)
		}
		if r := tg.run(t, "list", "-limit=1").want(t, exitOK, "stdout:more records: add -after="); !strings.Contains(r.stdout, "STATE") {
			t.Fatalf("list prints no table: %s", r)
		}

		if !tg.scopes {
			tg.run(t, "list", scope).want(t, exitUsage,
				"stderr:list cannot select records by scope or key", "stderr:digest of (scope, key)", "stderr:`dedupctl get SCOPE KEY` reads one record")
			tg.run(t, "list", "-prefix=d").want(t, exitUsage, "stderr:digest of (scope, key)")
			return
		}
		inScope := listed(scope)
		if len(inScope) != 3 {
			t.Fatalf("list %s = %+v, want its three records", scope, inScope)
		}
		for k, id := range ids {
			if r := inScope[id]; deref(r.Scope) != scope || deref(r.Key) != k {
				t.Fatalf("list %s shows %+v for %q", scope, r, k)
			}
		}
		if got := listed(scope, "-prefix=d"); len(got) != 1 || deref(got[ids["d1"]].Key) != "d1" {
			t.Fatalf("list -prefix=d = %+v", got)
		}
		if got := listed(scope, "-state=processing"); len(got) != 1 {
			t.Fatalf("list -state=processing = %+v", got)
		}
		r = tg.run(t, "list", scope).want(t, exitOK, `stdout:"p1"`, `stdout:"`+msg.UUID+`"`, "stdout:"+fp)
		header, _, _ := strings.Cut(r.stdout, "\n")
		if slices.Contains(strings.Fields(header), "ID") {
			t.Fatalf("list of a scope with known keys shows ids: %s", r)
		}
		tg.run(t, "list", scope+"-none").want(t, exitOK, "stdout:no records on")
	})
}

func TestForgetAndRelease(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope := "dedupctl-" + storetest.NewID()
		tg.done(t, scope, "d1")
		c := tg.claim(t, scope, "p1", time.Minute)

		// Without -yes nothing changes.
		tg.run(t, "forget", scope, "d1").want(t, exitRefused, "stdout:would forget 1 record", `stdout:"d1"`, "stderr:nothing deleted: add -yes")
		if got := tg.result(t, scope, "d1"); got != stores.Duplicate {
			t.Fatalf("forget without -yes: the record is %s", got)
		}
		// The wrong state.
		tg.run(t, "forget", scope, "p1", "-yes").want(t, exitRefused, "stderr:is processing", "stderr:release frees a claim")
		tg.run(t, "release", scope, "d1", "-yes").want(t, exitRefused, "stderr:is done", "stderr:forget deletes a done record")
		if tg.result(t, scope, "d1") != stores.Duplicate || tg.result(t, scope, "p1") != stores.InProgress {
			t.Fatal("a refused forget or release changed a record")
		}
		// forget: the message is processed again.
		tg.run(t, "forget", scope, "d1", "-yes").want(t, exitOK, `stdout:forgot scope "`+scope+`" key "d1"`)
		if got := tg.result(t, scope, "d1"); got != stores.Claimed {
			t.Fatalf("after forget, a claim is %s", got)
		}
		// release: another consumer can claim it; the owner is fenced off.
		var res removeResult
		tg.run(t, "release", scope, "p1", "-yes", "-json").want(t, exitOK).json(t, &res)
		if len(res.Deleted) != 1 || res.Deleted[0].Token != c.Token || res.Deleted[0].State != "processing" {
			t.Fatalf("release -json = %+v", res)
		}
		if err := tg.store.Complete(t.Context(), c, time.Hour, nil); !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Complete by the owner of a released claim: %v", err)
		}
		tg.run(t, "forget", scope, "d1", "-yes").want(t, exitNotFound, "stderr:nothing to forget")
		tg.run(t, "release", scope, "nope", "-yes").want(t, exitNotFound)

		// Several keys: never more than one without -all.
		for _, k := range []string{"batch-1", "batch-2", "batch-3", "other-1"} {
			tg.done(t, scope, k)
		}
		if !tg.scopes {
			tg.run(t, "forget", scope, "-prefix=batch-", "-all", "-yes").want(t, exitUsage, "stderr:forget cannot select records by scope or key", "stderr:digest of (scope, key)")
			tg.run(t, "release", scope, "-all", "-yes").want(t, exitUsage, "stderr:digest of (scope, key)")
			if tg.result(t, scope, "batch-1") != stores.Duplicate {
				t.Fatal("a refused forget -prefix changed a record")
			}
			return
		}
		tg.run(t, "forget", scope, "-prefix=batch-", "-yes").want(t, exitRefused, "stderr:3 done records", "stderr:add -all")
		tg.run(t, "forget", scope, "-prefix=batch-", "-all").want(t, exitRefused, "stdout:would forget 3 records", "stderr:add -yes")
		for _, k := range []string{"batch-1", "batch-2", "batch-3"} {
			if tg.result(t, scope, k) != stores.Duplicate {
				t.Fatalf("a refused forget changed %q", k)
			}
		}
		tg.run(t, "release", scope, "-prefix=batch-", "-all", "-yes").want(t, exitNotFound, "stderr:no processing record")
		res = removeResult{}
		tg.run(t, "forget", scope, "-prefix=batch-", "-all", "-yes", "-json").want(t, exitOK).json(t, &res)
		if len(res.Deleted) != 3 || len(res.Skipped) != 0 {
			t.Fatalf("forget -all = %+v", res)
		}
		for _, k := range []string{"batch-1", "batch-2", "batch-3"} {
			if tg.result(t, scope, k) != stores.Claimed {
				t.Fatalf("forget -all left %q", k)
			}
		}
		if tg.result(t, scope, "other-1") != stores.Duplicate {
			t.Fatal("forget -prefix=batch- deleted other-1")
		}
		// One match is fine without -all.
		tg.run(t, "forget", scope, "-prefix=other", "-yes").want(t, exitOK, `stdout:forgot scope "`+scope+`" key "other-1"`)
	})
}

func TestStatsAndPurge(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope, _ := tg.seed(t)
		tg.done(t, scope, "d2")
		want := stores.Counts{Processing: 1, Done: 2}
		if tg.opened.Redis == nil {
			// A done record whose retention ended an hour ago, written
			// by a store whose clock is two hours behind.
			past := storetest.NewFakeClock(time.Now().Add(-2 * time.Hour))
			var old stores.Store
			var err error
			if tg.opened.NATS != nil {
				old, err = natsstore.New(t.Context(), tg.opened.NATS, natsstore.Config{Bucket: tg.opened.Name, Clock: past})
			} else {
				old, err = sqlstore.New(tg.opened.DB, sqlstore.Config{Dialect: tg.opened.Dialect, Table: tg.opened.Name, Clock: past})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close(context.Background())
			c, err := old.Claim(t.Context(), scope, []string{"old"}, time.Minute)
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			if err := old.Complete(t.Context(), c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
			want.Expired = 1
		}

		var st statsJSON
		tg.run(t, "stats", "-json").want(t, exitOK).json(t, &st)
		if st.Processing != want.Processing || st.Done != want.Done || st.Expired != want.Expired || st.Total != want.Total() ||
			st.OldestExpiry == nil || st.NewestExpiry == nil || st.Bytes <= 0 || st.PerScope != tg.scopes {
			t.Fatalf("stats -json = %+v, want %+v", st, want)
		}
		r := tg.run(t, "stats").want(t, exitOK, "stdout:bytes a record")
		r.field(t, "records", strconv.FormatInt(want.Total(), 10)+":")
		if tg.scopes {
			if len(st.Scopes) != 1 || st.Scopes[0].Scope != scope || st.Scopes[0].Processing != 1 || st.Scopes[0].Done != 2 {
				t.Fatalf("stats -json scopes = %+v", st.Scopes)
			}
			r.want(t, exitOK, `stdout:"`+scope+`"  1`)
		} else {
			r.want(t, exitOK, "stdout:no counts by scope", "stdout:digest of (scope, key)")
			if len(st.Scopes) != 0 {
				t.Fatalf("stats -json of a SQL store has scopes: %+v", st.Scopes)
			}
		}

		if tg.opened.Redis != nil {
			tg.run(t, "purge").want(t, exitOK, "stdout:nothing to purge", "stdout:Redis deletes expired records by itself")
			return
		}
		tg.run(t, "purge").want(t, exitOK, "stdout:purged 1 expired record on")
		tg.run(t, "stats", "-json").want(t, exitOK).json(t, &st)
		if st.Expired != 0 || st.Done != 2 || st.Processing != 1 {
			t.Fatalf("stats after purge = %+v", st)
		}
		var purged struct{ Purged int64 }
		tg.run(t, "purge", "-json").want(t, exitOK).json(t, &purged)
		if purged.Purged != 0 {
			t.Fatalf("a second purge deleted %d records", purged.Purged)
		}
	})
}

// TestRunID points dedupctl at router_example's names for a run.
func TestRunID(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		if kind == anystore.StoreRedisCluster {
			// -run-id is the same flag on every store; the cluster test
			// checks the cluster itself instead: a node without
			// -redis-cluster holds a part of the records only.
			dedupctl(t, "-store=redis", "-redis-addr="+e.cluster[0], "stats").want(t, exitUsage, "stderr:is a node of a Redis Cluster: add -redis-cluster")
			return
		}
		runID := storetest.NewID()[:12]
		// router_example's names (router_example/stores.go).
		name := "router_example_" + runID // a table, or a NATS bucket
		if kind == anystore.StoreRedis {
			name = "router_example:" + runID + ":"
		}
		tg := e.open(t, kind, name)
		tg.done(t, "loyalty", "payment:PAY-1")
		tg.run(t, "-run-id="+runID, "get", "loyalty", "payment:PAY-1").want(t, exitOK).field(t, "state", "done")
		tg.run(t, "-run-id="+runID, "stats").want(t, exitOK, "stdout:"+name, "stdout:records  1: 0 processing, 1 done")
		// Another run: no record under its prefix, no table of its name.
		other := tg.run(t, "-run-id="+runID+"x", "get", "loyalty", "payment:PAY-1")
		switch kind {
		case anystore.StoreRedis:
			other.want(t, exitNotFound)
		case anystore.StoreNATS:
			other.want(t, exitError, "stderr:no such bucket", "stderr:router_example_"+runID+"x")
		default:
			other.want(t, exitError, "stderr:cannot read the table router_example_"+runID+"x")
		}
	})
}

func TestUnreachable(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	dedupctl(t, "-store=redis", "-redis-addr="+addr, "stats").
		want(t, exitError, "stderr:Redis is not reachable at "+addr+" (change it with -redis-addr or REDIS_ADDR)")
	dedupctl(t, "-store=redis", "-redis-cluster", "-redis-addr="+addr, "stats").want(t, exitError, "stderr:not reachable at "+addr)
	dedupctl(t, "-store=postgres", "-postgres-dsn=postgres://postgres@"+addr+"/test?sslmode=disable", "stats").
		want(t, exitError, "stderr:PostgreSQL is not reachable at "+addr+"/test (change it with -postgres-dsn or POSTGRES_DSN)")
	dedupctl(t, "-store=mysql", "-mysql-dsn=root@tcp("+addr+")/test", "stats").
		want(t, exitError, "stderr:MySQL/MariaDB is not reachable at "+addr+"/test")
	missing := filepath.Join(t.TempDir(), "none.db")
	dedupctl(t, "-store=sqlite", "-sqlite-file="+missing, "stats").want(t, exitError, "stderr:no SQLite database at "+missing)
	dedupctl(t, "-store=sqlite", "-dir="+t.TempDir(), "stats").want(t, exitError, "stderr:loyalty.db")

	// A database without the table.
	path := filepath.Join(t.TempDir(), "empty.db")
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE other (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	dedupctl(t, "-store=sqlite", "-sqlite-file="+path, "-table=dedup_nope", "get", "s", "k").
		want(t, exitError, "stderr:cannot read the table dedup_nope", "stderr:does it exist? change -table or -run-id")

	// The environment names the store.
	dedupctlEnv(t, map[string]string{"DEDUP_STORE": "redis", "REDIS_ADDR": addr}, "stats").want(t, exitError, "stderr:Redis is not reachable at "+addr)
	dedupctlEnv(t, map[string]string{"DEDUP_STORE": "redis", "REDIS_ADDR": addr}, "-redis-addr="+testkit.ClosedAddr(t), "stats").want(t, exitError, "stderr:Redis is not reachable")
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "no command"},
		{[]string{"stats"}, nil, "no store: set -store"},
		{[]string{"-store=oracle", "stats"}, nil, `unknown store "oracle"`},
		{[]string{"-store=memory", "stats"}, nil, "the memory store lives inside its process"},
		{[]string{"-store=redis", "frob"}, nil, `unknown command "frob"`},
		{[]string{"-store=redis", "get", "scope"}, nil, "get takes SCOPE and KEY"},
		{[]string{"-store=redis", "stats", "extra"}, nil, "stats takes no arguments"},
		{[]string{"-store=redis", "list", "a", "b"}, nil, "list takes at most a SCOPE"},
		{[]string{"-store=redis", "list", "-yes"}, nil, "list does not take -yes"},
		{[]string{"-store=redis", "get", "s", "k", "-all"}, nil, "get does not take -all"},
		{[]string{"-store=redis", "forget", "s"}, nil, "forget needs the KEY, or -prefix=KEY_PREFIX, or -all"},
		{[]string{"-store=redis", "release", "s", "k", "-prefix=x"}, nil, "release takes KEY or -prefix, not both"},
		{[]string{"-store=redis", "forget", "", "-all", "-yes"}, nil, "forget with -prefix or -all needs a SCOPE: an empty one would select"},
		{[]string{"-store=redis", "forget", "-id=abc", "-prefix=x"}, nil, "forget -id names one record: it takes no -prefix or -all"},
		{[]string{"-store=redis", "release", "", "-prefix=k"}, nil, "release with -prefix or -all needs a SCOPE"},
		{[]string{"-store=redis", "-timeout=5", "stats"}, nil, "a duration needs a unit"},
		{[]string{"-store=redis", "-run-id=Run-1", "stats"}, nil, "-run-id must be 1-16 lowercase letters or digits"},
		{[]string{"-store=redis", "list", "-state=gone"}, nil, "-state must be processing or done"},
		{[]string{"-store=redis", "list", "-limit=0"}, nil, "-limit must be between 1 and 10000"},
		{[]string{"-store=sqlite", "stats"}, nil, "-store=sqlite needs the database file"},
		{[]string{"-store=redis", "-nosuchflag", "stats"}, nil, "flag provided but not defined: -nosuchflag"},
		{[]string{"stats"}, map[string]string{"DEDUP_STORE": "redis", "DEDUP_TIMEOUT": "5"}, "environment variable DEDUP_TIMEOUT"},
		{[]string{"stats"}, map[string]string{"DEDUP_STORE": "oracle"}, `unknown store "oracle"`},
	} {
		dedupctlEnv(t, tc.env, tc.args...).want(t, exitUsage, "stderr:"+tc.want)
	}
	for _, help := range [][]string{{"-help"}, {"help"}, {"-store=redis", "list", "-h"}} {
		dedupctl(t, help...).want(t, exitOK, "stdout:Usage: dedupctl", "stdout:Exit status: 0 done", "stdout:[env REDIS_ADDR]")
	}
}

// Flags may come after the command and its arguments, and "--" lets a
// key start with a dash.
func TestArgumentOrder(t *testing.T) {
	for _, args := range [][]string{
		{"-store=redis", "get", "s", "k"},
		{"get", "-store=redis", "s", "k"},
		{"get", "s", "k", "-store=redis"},
		{"get", "-store", "redis", "s", "--", "k"},
	} {
		cfg, cmd, pos, err := parseArgs(args, func(string) string { return "" })
		if err != nil || cmd != "get" || cfg.store != "redis" || len(pos) != 2 || pos[0] != "s" || pos[1] != "k" {
			t.Errorf("parseArgs(%q) = %q %q %q, %v", args, cfg.store, cmd, pos, err)
		}
	}
	_, _, pos, err := parseArgs([]string{"-store=redis", "get", "s", "--", "-k"}, func(string) string { return "" })
	if err != nil || len(pos) != 2 || pos[1] != "-k" {
		t.Errorf("a key after -- = %q, %v", pos, err)
	}
}

func TestExitCodes(t *testing.T) {
	for err, want := range map[error]int{
		usagef("x"):            exitUsage,
		&notFoundError{"x"}:    exitNotFound,
		&refusedError{"x"}:     exitRefused,
		stores.ErrNotSupported: exitUsage,
		stores.ErrWrongState:   exitRefused,
		stores.ErrUnavailable:  exitError,
		errors.New("x"):        exitError,
		&storeopen.UnreachableError{Service: "R", Addr: "a", Setting: "s"}: exitError,
		&storeopen.SettingError{Setting: "s", Err: errors.New("x")}:        exitUsage,
	} {
		if got := exitCode(err); got != want {
			t.Errorf("exitCode(%v) = %d, want %d", err, got, want)
		}
	}
}

// TestGetLinkedRun: get shows the run that completed a record whose
// tracing linked runs (Tracing.LinkRuns), or that holds a processing
// one: its trace and span, as a table row and in -json; a record of an
// unlinked run shows none.
func TestGetLinkedRun(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope := "dedupctl-" + storetest.NewID()
		tp := sdktrace.NewTracerProvider()
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		run := func(links bool) (*message.Message, trace.SpanContext) {
			mw, err := middleware.New(middleware.Config{Store: tg.store, Scope: scope, Policy: dedup.Policy{
				Retention: time.Hour, Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tp, LinkRuns: links}}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, span := tp.Tracer("test").Start(context.Background(), "handler")
			defer span.End()
			msg := message.NewMessage("m-"+storetest.NewID(), nil)
			msg.SetContext(ctx)
			if _, err := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
				t.Fatal(err)
			}
			if err := mw.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
			return msg, span.SpanContext()
		}
		linked, sc := run(true)
		r := tg.run(t, "get", scope, linked.UUID).want(t, exitOK)
		r.field(t, "completed by", "trace "+sc.TraceID().String()+", span "+sc.SpanID().String())
		var got recordJSON
		tg.run(t, "get", "-json", scope, linked.UUID).want(t, exitOK).json(t, &got)
		if got.TraceID != sc.TraceID().String() || got.SpanID != sc.SpanID().String() {
			t.Fatalf("get -json of a linked run's record = %+v, want trace %s span %s", got, sc.TraceID(), sc.SpanID())
		}
		// A processing record a linked run claimed names that run.
		oc, ok := tg.store.(stores.OwnerClaimer)
		if !ok {
			t.Fatalf("%T keeps no owners", tg.store)
		}
		if c, err := oc.ClaimOwned(t.Context(), scope, []string{"held"}, time.Minute, record.AppendRun(nil, sc)); err != nil || c.Result != stores.Claimed {
			t.Fatalf("ClaimOwned = %v, %v", c, err)
		}
		r = tg.run(t, "get", scope, "held").want(t, exitOK)
		r.field(t, "claimed by", "trace "+sc.TraceID().String()+", span "+sc.SpanID().String())
		got = recordJSON{}
		tg.run(t, "get", "-json", scope, "held").want(t, exitOK).json(t, &got)
		if got.State != "processing" || got.TraceID != sc.TraceID().String() || got.SpanID != sc.SpanID().String() {
			t.Fatalf("get -json of a linked run's processing record = %+v", got)
		}
		unlinked, _ := run(false)
		if r := tg.run(t, "get", scope, unlinked.UUID).want(t, exitOK); strings.Contains(r.stdout, "completed by") {
			t.Fatalf("get of an unlinked run's record names a run:\n%s", r.stdout)
		}
		got = recordJSON{}
		tg.run(t, "get", "-json", scope, unlinked.UUID).want(t, exitOK).json(t, &got)
		if got.TraceID != "" || got.SpanID != "" {
			t.Fatalf("get -json of an unlinked run's record = %+v", got)
		}
	})
}
