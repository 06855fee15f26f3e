package storetest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// The conformance tests of [stores.Admin]. Run runs them on a store that
// implements it (and skips them, saying so, on one that does not). They
// expect the store the factory returns to have no other writer while
// they run.

// AdminNoScopes tells the suite that the store keeps each record under a
// digest of (scope, key), as memstore, sqlstore, natsstore and
// redisstore with CompactKeys do: List by scope or key prefix must fail with
// [stores.ErrNotSupported], listed records have no scope or key, and
// Stats has no per-scope counts.
func AdminNoScopes() Option {
	return func(o *options) { o.adminNoScopes = true }
}

// AdminNoKeys tells the suite that the store keeps the scope of each
// record but stores the suite's keys as digests (redisstore with
// DigestKeysLongerThan): listed records have a scope and no key, and a
// List by key prefix lists none of them.
func AdminNoKeys() Option {
	return func(o *options) { o.adminNoKeys = true }
}

// adminTests are Run's tests of the admin interface.
var adminTests = []struct {
	name string
	fn   func(e *env, a stores.Admin)
}{
	{"AdminGet", testAdminGet},
	{"AdminDelete", testAdminDelete},
	{"AdminByID", testAdminByID},
	{"AdminList", testAdminList},
	{"AdminListByScope", testAdminListByScope},
	{"AdminStats", testAdminStats},
	{"AdminPurge", testAdminPurge},
	{"AdminInvalidInput", testAdminInvalidInput},
	{"AdminClosed", testAdminClosed},
}

// admin returns the store's admin interface, or skips the test.
func (e *env) admin() stores.Admin {
	e.t.Helper()
	a, ok := e.s.(stores.Admin)
	if !ok {
		e.t.Skipf("%T does not implement stores.Admin", e.s)
	}
	return a
}

// long is a lease or retention that outlasts any test: a week on the fake
// clock (within sqlstore's partitioned layout's 8 days), 20 hours on a
// server's clock the suite moves (within natsstore's default
// MaxRetention of a day), a minute in real time.
func (e *env) long() time.Duration {
	switch {
	case e.opts.serverTime != nil:
		return 20 * time.Hour
	case e.opts.realTime:
		return time.Minute
	}
	return 7 * 24 * time.Hour
}

// now is the time the store sees.
func (e *env) now() time.Time {
	if e.opts.realTime {
		return time.Now()
	}
	return e.clock.Now()
}

// slack is how far a reported time may fall outside the instants that
// bound it, or two reports of one time may differ: the stores'
// precision (a millisecond at worst) on the fake clock; in real time
// also the latency of a store that computes times from a remaining TTL
// (redisstore: a report lags by up to the call that made it), which is
// the longest admin call seen so far (see timed), however slow the
// machine was, and not a guess at it.
func (e *env) slack() time.Duration {
	if e.opts.realTime {
		return 2*time.Millisecond + e.maxCall
	}
	return time.Millisecond
}

// timed runs call, an admin call whose reports the suite compares, and
// remembers how long it took (see slack).
func (e *env) timed(call func()) {
	start := time.Now()
	call()
	e.maxCall = max(e.maxCall, time.Since(start))
}

func (e *env) within(what string, got, from, to time.Time) {
	e.t.Helper()
	if got.Before(from.Add(-e.slack())) || got.After(to.Add(e.slack())) {
		e.t.Fatalf("%s = %s, want between %s and %s", what, got, from, to)
	}
}

// done claims and completes key in scope with data for retention. The
// claim's lease is the suite's: a longer one would make sqlstore's purge
// keep lapsed claims longer (see testAdminPurge).
func (e *env) done(scope, key string, retention time.Duration, data []byte) {
	e.t.Helper()
	c, err := e.s.Claim(e.ctx, scope, []string{key}, e.lease())
	if err != nil || c.Result != stores.Claimed {
		e.t.Fatalf("Claim(%q, %q) = %+v, %v", scope, key, c, err)
	}
	if err := e.s.Complete(e.ctx, c, retention, data); err != nil {
		e.t.Fatalf("Complete(%q, %q): %v", scope, key, err)
	}
}

func (e *env) get(a stores.Admin, scope, key string) stores.Record {
	e.t.Helper()
	var r stores.Record
	var err error
	e.timed(func() { r, err = a.Get(e.ctx, scope, key) })
	if err != nil {
		e.t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	if !r.ScopeKnown || !r.KeyKnown || r.Scope != scope || r.Key != key {
		e.t.Fatalf("Get(%q, %q) reports scope %q (known %v) and key %q (known %v)", scope, key, r.Scope, r.ScopeKnown, r.Key, r.KeyKnown)
	}
	if r.ID == "" {
		e.t.Fatalf("Get(%q, %q) reports no ID", scope, key)
	}
	return r
}

func (e *env) mustBeProcessing(what string, r stores.Record, token string) {
	e.t.Helper()
	if r.State != stores.StateProcessing || r.Token != token || r.LeaseUntil.IsZero() || !r.ExpiresAt.IsZero() || r.Data != nil {
		e.t.Fatalf("%s = %+v, want processing under token %q with a lease and no expiry or data", what, r, token)
	}
}

func (e *env) mustBeDone(what string, r stores.Record, data []byte) {
	e.t.Helper()
	if r.State != stores.StateDone || r.Token != "" || !r.LeaseUntil.IsZero() || r.ExpiresAt.IsZero() || !bytes.Equal(r.Data, data) {
		e.t.Fatalf("%s = %+v, want done with an expiry, no token or lease, and data %q", what, r, data)
	}
}

func testAdminGet(e *env, a stores.Admin) {
	kp, kd, kn := e.key("processing"), e.key("done"), e.key("nodata")
	before := e.now()
	cp := e.claimLease(e.long(), kp)
	e.mustResult(cp, stores.Claimed)
	e.done(e.scope, kd, e.long(), []byte("outputs"))
	e.done(e.scope, kn, e.long(), nil)

	rp := e.get(a, e.scope, kp)
	e.mustBeProcessing("Get of a processing record", rp, cp.Token)
	e.within("LeaseUntil", rp.LeaseUntil, before.Add(e.long()), e.now().Add(e.long()))
	if rp.Expired {
		e.t.Fatal("a live processing record is reported expired")
	}
	rd := e.get(a, e.scope, kd)
	e.mustBeDone("Get of a done record", rd, []byte("outputs"))
	e.within("ExpiresAt", rd.ExpiresAt, before.Add(e.long()), e.now().Add(e.long()))
	if rd.Expired {
		e.t.Fatal("a live done record is reported expired")
	}
	e.mustBeDone("Get of a done record without data", e.get(a, e.scope, kn), nil)
	if rp.ID == rd.ID {
		e.t.Fatalf("two records share the ID %q", rp.ID)
	}
	if again := e.get(a, e.scope, kd); again.ID != rd.ID {
		e.t.Fatalf("the ID of a record changed from %q to %q", rd.ID, again.ID)
	}

	_, err := a.Get(e.ctx, e.scope, e.key("none"))
	mustBe(e.t, "Get of a key without a record", err, stores.ErrNotFound)
	_, err = a.Get(e.ctx, e.scope+"-other", kd)
	mustBe(e.t, "Get of a key in another scope", err, stores.ErrNotFound)

	// A lease that ran out: the record is still there (the contract keeps
	// it for one more lease), expired, under its token.
	ke := e.key("lapsed")
	ce := e.expect([]string{ke}, stores.Claimed)
	e.advance(e.lease() + e.lease()/2)
	re := e.get(a, e.scope, ke)
	e.mustBeProcessing("Get of a processing record whose lease ran out", re, ce.Token)
	if !re.Expired {
		e.t.Fatalf("a processing record whose lease ran out is not reported expired: %+v", re)
	}
	// Reading changed nothing.
	e.expect([]string{kd}, stores.Duplicate)
	e.expect([]string{kp}, stores.InProgress)
}

func testAdminDelete(e *env, a stores.Admin) {
	kd, kp := e.key("done"), e.key("processing")
	e.done(e.scope, kd, e.long(), []byte("x"))
	cp := e.claimLease(e.long(), kp)
	e.mustResult(cp, stores.Claimed)

	// The wrong state: nothing changes, the record comes back.
	r, err := a.Delete(e.ctx, e.scope, kd, stores.StateProcessing)
	mustBe(e.t, "Delete(processing) of a done record", err, stores.ErrWrongState)
	e.mustBeDone("the record Delete refused", r, []byte("x"))
	r, err = a.Delete(e.ctx, e.scope, kp, stores.StateDone)
	mustBe(e.t, "Delete(done) of a processing record", err, stores.ErrWrongState)
	e.mustBeProcessing("the record Delete refused", r, cp.Token)
	e.expect([]string{kd}, stores.Duplicate)
	e.expect([]string{kp}, stores.InProgress)

	// Forget a done record: its message is processed again.
	r, err = a.Delete(e.ctx, e.scope, kd, stores.StateDone)
	if err != nil {
		e.t.Fatalf("Delete(done) of a done record: %v", err)
	}
	e.mustBeDone("the record Delete deleted", r, []byte("x"))
	if r.Scope != e.scope || r.Key != kd || !r.ScopeKnown || !r.KeyKnown {
		e.t.Fatalf("Delete reports scope %q key %q, want %q %q", r.Scope, r.Key, e.scope, kd)
	}
	_, err = a.Get(e.ctx, e.scope, kd)
	mustBe(e.t, "Get after Delete", err, stores.ErrNotFound)
	again := e.expect([]string{kd}, stores.Claimed)
	if again.Takeover {
		e.t.Fatal("the claim of a forgotten record reports Takeover")
	}
	e.release(again)

	// Release a processing record: another consumer claims it, and the
	// owner is fenced off.
	r, err = a.Delete(e.ctx, e.scope, kp, stores.StateProcessing)
	if err != nil {
		e.t.Fatalf("Delete(processing) of a processing record: %v", err)
	}
	e.mustBeProcessing("the record Delete deleted", r, cp.Token)
	next := e.expect([]string{kp}, stores.Claimed)
	mustBe(e.t, "Complete by the owner of a deleted claim", e.s.Complete(e.ctx, cp, e.retention(), nil), stores.ErrLostClaim)
	e.release(next)

	_, err = a.Delete(e.ctx, e.scope, e.key("none"), stores.StateDone)
	mustBe(e.t, "Delete of a key without a record", err, stores.ErrNotFound)

	// One key of a multi-key claim: the claim is lost as a whole, and its
	// other key is left as it was.
	k1, k2 := e.key("m1"), e.key("m2")
	cm := e.claimLease(e.long(), k1, k2)
	e.mustResult(cm, stores.Claimed)
	if _, err := a.Delete(e.ctx, e.scope, k1, stores.StateProcessing); err != nil {
		e.t.Fatalf("Delete of one key of a multi-key claim: %v", err)
	}
	mustBe(e.t, "Complete of a multi-key claim with a deleted key", e.s.Complete(e.ctx, cm, e.retention(), nil), stores.ErrLostClaim)
	e.mustBeProcessing("the other key of the claim", e.get(a, e.scope, k2), cm.Token)

	// A claim whose lease ran out can be released too.
	kl := e.key("lapsed")
	cl := e.expect([]string{kl}, stores.Claimed)
	e.advance(e.lease() + e.lease()/2)
	if r, err := a.Delete(e.ctx, e.scope, kl, stores.StateProcessing); err != nil || !r.Expired || r.Token != cl.Token {
		e.t.Fatalf("Delete of a lapsed claim = %+v, %v; want it, expired", r, err)
	}
	e.release(e.expect([]string{kl}, stores.Claimed))
}

// getByID is GetByID of id, which must find the record want (a Get's
// view of it).
func (e *env) getByID(a stores.Admin, id string, want stores.Record) stores.Record {
	e.t.Helper()
	var r stores.Record
	var err error
	e.timed(func() { r, err = a.GetByID(e.ctx, id) })
	if err != nil {
		e.t.Fatalf("GetByID(%q): %v", id, err)
	}
	if r.ID != id {
		e.t.Fatalf("GetByID(%q) returned the record of ID %q", id, r.ID)
	}
	e.sameRecord(r, want)
	return r
}

// testAdminByID: GetByID and DeleteByID find a record by the ID Get and
// List report, with the state checks of Delete.
func testAdminByID(e *env, a stores.Admin) {
	kd, kp := e.key("done"), e.key("processing")
	e.done(e.scope, kd, e.long(), []byte("x"))
	cp := e.claimLease(e.long(), kp)
	e.mustResult(cp, stores.Claimed)
	rd, rp := e.get(a, e.scope, kd), e.get(a, e.scope, kp)

	// By the IDs of Get, and by those of List.
	e.mustBeDone("GetByID of a done record", e.getByID(a, rd.ID, rd), []byte("x"))
	e.mustBeProcessing("GetByID of a processing record", e.getByID(a, rp.ID, rp), cp.Token)
	listed := e.byID(e.listAll(a, stores.ListOptions{}))
	for _, w := range []stores.Record{rd, rp} {
		l, ok := listed[w.ID]
		if !ok {
			e.t.Fatalf("List does not list %q", w.ID)
		}
		e.getByID(a, l.ID, w)
	}

	// The wrong state: nothing changes, the record comes back.
	r, err := a.DeleteByID(e.ctx, rd.ID, stores.StateProcessing)
	mustBe(e.t, "DeleteByID(processing) of a done record", err, stores.ErrWrongState)
	e.mustBeDone("the record DeleteByID refused", r, []byte("x"))
	r, err = a.DeleteByID(e.ctx, rp.ID, stores.StateDone)
	mustBe(e.t, "DeleteByID(done) of a processing record", err, stores.ErrWrongState)
	e.mustBeProcessing("the record DeleteByID refused", r, cp.Token)
	e.expect([]string{kd}, stores.Duplicate)
	e.expect([]string{kp}, stores.InProgress)

	// Forget a done record: its message is processed again.
	r, err = a.DeleteByID(e.ctx, rd.ID, stores.StateDone)
	if err != nil {
		e.t.Fatalf("DeleteByID(done) of a done record: %v", err)
	}
	e.mustBeDone("the record DeleteByID deleted", r, []byte("x"))
	if r.ID != rd.ID {
		e.t.Fatalf("DeleteByID(%q) reports the ID %q", rd.ID, r.ID)
	}
	_, err = a.Get(e.ctx, e.scope, kd)
	mustBe(e.t, "Get after DeleteByID", err, stores.ErrNotFound)
	_, err = a.GetByID(e.ctx, rd.ID)
	mustBe(e.t, "GetByID after DeleteByID", err, stores.ErrNotFound)
	_, err = a.DeleteByID(e.ctx, rd.ID, stores.StateDone)
	mustBe(e.t, "DeleteByID of an ID without a record", err, stores.ErrNotFound)
	e.release(e.expect([]string{kd}, stores.Claimed))

	// Release a processing record: another consumer claims it, and the
	// owner is fenced off.
	r, err = a.DeleteByID(e.ctx, rp.ID, stores.StateProcessing)
	if err != nil {
		e.t.Fatalf("DeleteByID(processing) of a processing record: %v", err)
	}
	e.mustBeProcessing("the record DeleteByID deleted", r, cp.Token)
	next := e.expect([]string{kp}, stores.Claimed)
	mustBe(e.t, "Complete by the owner of a claim deleted by ID", e.s.Complete(e.ctx, cp, e.retention(), nil), stores.ErrLostClaim)
	e.release(next)

	// A claim whose lease ran out can be released by its ID too.
	kl := e.key("lapsed")
	cl := e.expect([]string{kl}, stores.Claimed)
	rl := e.get(a, e.scope, kl)
	e.advance(e.lease() + e.lease()/2)
	if r, err := a.DeleteByID(e.ctx, rl.ID, stores.StateProcessing); err != nil || !r.Expired || r.Token != cl.Token {
		e.t.Fatalf("DeleteByID of a lapsed claim = %+v, %v; want it, expired", r, err)
	}
	e.release(e.expect([]string{kl}, stores.Claimed))
}

// listAll pages through List with opts, checking each page, and returns
// every record listed.
func (e *env) listAll(a stores.Admin, opts stores.ListOptions) []stores.Record {
	e.t.Helper()
	var out []stores.Record
	for pages := 0; ; pages++ {
		if pages > 10000 {
			e.t.Fatalf("List(%+v) has more than 10000 pages", opts)
		}
		var recs []stores.Record
		var next string
		var err error
		e.timed(func() { recs, next, err = a.List(e.ctx, opts) })
		if err != nil {
			e.t.Fatalf("List(%+v): %v", opts, err)
		}
		if opts.Limit > 0 && len(recs) > opts.Limit {
			e.t.Fatalf("List(%+v) returned %d records, more than its limit", opts, len(recs))
		}
		for _, r := range recs {
			if r.ID == "" {
				e.t.Fatalf("List(%+v) returned a record without an ID: %+v", opts, r)
			}
			if opts.State != 0 && r.State != opts.State {
				e.t.Fatalf("List(%+v) returned a %s record", opts, r.State)
			}
		}
		out = append(out, recs...)
		if next == "" {
			return out
		}
		if next == opts.After {
			e.t.Fatalf("List(%+v) returned its own cursor as the next one", opts)
		}
		opts.After = next
	}
}

// byID indexes records by ID, checking that a record listed twice (see
// stores.Admin.List) is listed the same.
func (e *env) byID(recs []stores.Record) map[string]stores.Record {
	e.t.Helper()
	m := make(map[string]stores.Record, len(recs))
	for _, r := range recs {
		if prev, ok := m[r.ID]; ok && (prev.State != r.State || prev.Scope != r.Scope || prev.Key != r.Key) {
			e.t.Fatalf("record %q listed twice, differently: %+v and %+v", r.ID, prev, r)
		}
		m[r.ID] = r
	}
	return m
}

// sameRecord checks that a listed record is the one Get returned.
func (e *env) sameRecord(listed, got stores.Record) {
	e.t.Helper()
	if listed.State != got.State || listed.Token != got.Token || listed.Expired != got.Expired || !bytes.Equal(listed.Data, got.Data) {
		e.t.Fatalf("List reports %+v, Get %+v", listed, got)
	}
	for _, p := range [][2]time.Time{{listed.LeaseUntil, got.LeaseUntil}, {listed.ExpiresAt, got.ExpiresAt}} {
		if d := p[0].Sub(p[1]).Abs(); d > e.slack() || p[0].IsZero() != p[1].IsZero() {
			e.t.Fatalf("List reports %+v, Get %+v", listed, got)
		}
	}
	if listed.ScopeKnown && listed.Scope != got.Scope {
		e.t.Fatalf("List reports scope %q, Get %q", listed.Scope, got.Scope)
	}
	if listed.KeyKnown && listed.Key != got.Key {
		e.t.Fatalf("List reports key %q, Get %q", listed.Key, got.Key)
	}
	if !e.opts.adminNoScopes && !listed.ScopeKnown {
		e.t.Fatalf("List does not report the scope of %+v", listed)
	}
	if !e.opts.adminNoScopes && !e.opts.adminNoKeys && !listed.KeyKnown {
		e.t.Fatalf("List does not report the key of %+v", listed)
	}
	if e.opts.adminNoScopes && (listed.ScopeKnown || listed.KeyKnown) {
		e.t.Fatalf("a store keeping no scopes reports the scope or key of %+v", listed)
	}
}

// writeList writes, in scope, done records under keys d-0..d-4 (two with
// data) and processing records under p-0..p-2, and returns Get's view of
// each, by key.
func (e *env) writeList(a stores.Admin, scope string) map[string]stores.Record {
	e.t.Helper()
	want := map[string]stores.Record{}
	for i := range 5 {
		k := e.key("d-" + strconv.Itoa(i))
		var data []byte
		if i%2 == 0 {
			data = []byte("data " + k)
		}
		e.done(scope, k, e.long(), data)
		want[k] = e.get(a, scope, k)
	}
	for i := range 3 {
		k := e.key("p-" + strconv.Itoa(i))
		c, err := e.s.Claim(e.ctx, scope, []string{k}, e.long())
		if err != nil || c.Result != stores.Claimed {
			e.t.Fatalf("Claim(%q, %q) = %+v, %v", scope, k, c, err)
		}
		want[k] = e.get(a, scope, k)
	}
	return want
}

func testAdminList(e *env, a stores.Admin) {
	want := e.writeList(a, e.scope)
	other := e.scope + "-other"
	e.done(other, e.key("d-0"), e.long(), nil)
	want["other"] = e.get(a, other, e.key("d-0"))

	for _, opts := range []stores.ListOptions{
		{Limit: 1}, {Limit: 2}, {Limit: 3}, {}, {Limit: stores.MaxListLimit},
		{State: stores.StateDone, Limit: 2}, {State: stores.StateProcessing, Limit: 2},
	} {
		listed := e.byID(e.listAll(a, opts))
		for k, w := range want {
			r, ok := listed[w.ID]
			switch {
			case opts.State != 0 && w.State != opts.State:
				if ok {
					e.t.Fatalf("List(%+v) lists %q, a %s record", opts, k, w.State)
				}
			case !ok:
				e.t.Fatalf("List(%+v) does not list %q (ID %q)", opts, k, w.ID)
			default:
				e.sameRecord(r, w)
			}
		}
	}
}

func testAdminListByScope(e *env, a stores.Admin) {
	if e.opts.adminNoScopes {
		e.writeList(a, e.scope)
		for _, opts := range []stores.ListOptions{
			{Scope: e.scope}, {KeyPrefix: e.key("d-")}, {Scope: e.scope, KeyPrefix: e.key("d-"), State: stores.StateDone},
		} {
			_, _, err := a.List(e.ctx, opts)
			mustBe(e.t, "List by scope or key on a layout that keeps neither", err, stores.ErrNotSupported)
		}
		return
	}
	want := e.writeList(a, e.scope)
	// Scopes that a naive prefix match would take for e.scope, and
	// scopes of the bytes a layout must escape.
	neighbours := []string{e.scope + "-other", e.scope + ":a", e.scope + "{a}", e.scope + "%3A", e.scope + "=x", e.scope + "#"}
	for _, sc := range neighbours {
		e.done(sc, e.key("d-0"), e.long(), nil)
	}

	check := func(opts stores.ListOptions, keys func(k string) bool) {
		e.t.Helper()
		listed := e.byID(e.listAll(a, opts))
		n := 0
		for k, w := range want {
			if !keys(k) || (opts.State != 0 && w.State != opts.State) {
				continue
			}
			n++
			r, ok := listed[w.ID]
			if !ok {
				e.t.Fatalf("List(%+v) does not list %q", opts, k)
			}
			e.sameRecord(r, w)
		}
		if len(listed) != n {
			e.t.Fatalf("List(%+v) lists %d records, want %d: %+v", opts, len(listed), n, listed)
		}
	}
	all := func(string) bool { return true }
	check(stores.ListOptions{Scope: e.scope, Limit: 3}, all)
	check(stores.ListOptions{Scope: e.scope, State: stores.StateProcessing}, all)
	if e.opts.adminNoKeys {
		check(stores.ListOptions{Scope: e.scope, KeyPrefix: e.key("d-")}, func(string) bool { return false })
	} else {
		prefix := e.key("d-")
		isDone := func(k string) bool { return strings.HasPrefix(k, prefix) }
		check(stores.ListOptions{Scope: e.scope, KeyPrefix: prefix, Limit: 2}, isDone)
		check(stores.ListOptions{Scope: e.scope, KeyPrefix: prefix, State: stores.StateProcessing}, isDone)
		check(stores.ListOptions{Scope: e.scope, KeyPrefix: e.key("d-3")}, func(k string) bool { return k == e.key("d-3") })
	}

	for _, sc := range neighbours {
		recs := e.listAll(a, stores.ListOptions{Scope: sc})
		if len(recs) != 1 || recs[0].Scope != sc || !recs[0].ScopeKnown {
			e.t.Fatalf("List(scope %q) = %+v, want its one record", sc, recs)
		}
	}
	// A key prefix alone selects in every scope.
	if !e.opts.adminNoKeys {
		got := e.listAll(a, stores.ListOptions{KeyPrefix: e.key("d-0")})
		if len(e.byID(got)) != 1+len(neighbours) {
			e.t.Fatalf("List(key prefix %q) = %+v, want the key in %d scopes", e.key("d-0"), got, 1+len(neighbours))
		}
	}
}

func testAdminStats(e *env, a stores.Admin) {
	s0, err := a.Stats(e.ctx)
	if err != nil {
		e.t.Fatalf("Stats: %v", err)
	}
	// Two live processing records, three done, then one processing
	// record whose lease runs out.
	for i := range 2 {
		e.mustResult(e.claimLease(e.long(), e.key("p-"+strconv.Itoa(i))), stores.Claimed)
	}
	for i := range 3 {
		e.done(e.scope, e.key("d-"+strconv.Itoa(i)), e.long()-time.Duration(i)*time.Second, []byte("data"))
	}
	e.expect([]string{e.key("lapsed")}, stores.Claimed)
	e.advance(e.lease() + e.lease()/2)
	// The expiries as Get reports them after the suite moved time: a
	// store whose time the suite moves on its server (ServerTime) reports
	// them moved.
	var expiries []time.Time
	for i := range 3 {
		expiries = append(expiries, e.get(a, e.scope, e.key("d-"+strconv.Itoa(i))).ExpiresAt)
	}
	var s1 stores.Stats
	e.timed(func() { s1, err = a.Stats(e.ctx) })
	if err != nil {
		e.t.Fatalf("Stats: %v", err)
	}
	want := stores.Counts{Processing: 2, Done: 3, Expired: 1}
	delta := stores.Counts{Processing: s1.Processing - s0.Processing, Done: s1.Done - s0.Done, Expired: s1.Expired - s0.Expired}
	if delta != want {
		e.t.Fatalf("Stats counts grew by %+v, want %+v (before %+v, after %+v)", delta, want, s0.Counts, s1.Counts)
	}
	oldest, newest := slices.MinFunc(expiries, time.Time.Compare), slices.MaxFunc(expiries, time.Time.Compare)
	if s1.OldestExpiry.After(oldest.Add(e.slack())) || s1.NewestExpiry.Before(newest.Add(-e.slack())) {
		e.t.Fatalf("Stats expiries %s to %s, want them to span %s to %s", s1.OldestExpiry, s1.NewestExpiry, oldest, newest)
	}
	if s1.Skipped != s0.Skipped || len(s1.SkippedSample) > stores.MaxSkippedSample {
		e.t.Fatalf("Stats skipped %d keys (%q), %d before: the store's own records are not skipped", s1.Skipped, s1.SkippedSample, s0.Skipped)
	}
	if s1.Bytes == 0 || s1.Bytes < -1 {
		e.t.Fatalf("Stats.Bytes = %d with records held, want a size or -1", s1.Bytes)
	}

	if e.opts.adminNoScopes {
		if s1.PerScope || len(s1.Scopes) != 0 {
			e.t.Fatalf("a store keeping no scopes reports per-scope stats: %+v", s1.Scopes)
		}
		return
	}
	if !s1.PerScope {
		e.t.Fatal("Stats has no per-scope counts")
	}
	if !slices.IsSortedFunc(s1.Scopes, func(x, y stores.ScopeStats) int { return strings.Compare(x.Scope, y.Scope) }) {
		e.t.Fatalf("Stats.Scopes are not sorted: %+v", s1.Scopes)
	}
	i := slices.IndexFunc(s1.Scopes, func(s stores.ScopeStats) bool { return s.Scope == e.scope })
	if i < 0 {
		e.t.Fatalf("Stats.Scopes has no row for %q: %+v", e.scope, s1.Scopes)
	}
	sc := s1.Scopes[i]
	if sc.Counts != want {
		e.t.Fatalf("Stats of scope %q = %+v, want %+v", e.scope, sc.Counts, want)
	}
	e.within("the scope's OldestExpiry", sc.OldestExpiry, oldest, oldest)
	e.within("the scope's NewestExpiry", sc.NewestExpiry, newest, newest)
	var sum stores.Counts
	for _, s := range s1.Scopes {
		sum.Processing += s.Processing
		sum.Done += s.Done
		sum.Expired += s.Expired
	}
	if sum != s1.Counts {
		e.t.Fatalf("the scopes' counts add up to %+v, the total is %+v", sum, s1.Counts)
	}
}

// purgeWait is how long after a record expired a purge must have deleted
// it: on the fake clock two days and a bit, so that sqlstore's
// partitioned layout can drop the partition of its day; on a server's
// clock the suite moves, a minute; in real time a unit.
func (e *env) purgeWait() time.Duration {
	switch {
	case e.opts.serverTime != nil:
		return time.Minute
	case e.opts.realTime:
		return e.opts.unit
	}
	return 49 * time.Hour
}

// testAdminPurge gives no lease longer than the suite's: sqlstore's purge
// keeps lapsed claims for at least the longest lease the store gave, and
// its partitioned layout drops a day only once every record in it may go.
func testAdminPurge(e *env, a stores.Admin) {
	kd, kx := e.key("done"), e.key("expiring")
	e.done(e.scope, kd, e.long(), nil)
	e.done(e.scope, kx, e.retention(), []byte("x"))
	e.advance(e.retention() + e.purgeWait())

	if n, err := a.Purge(e.ctx); err != nil || n < 0 {
		e.t.Fatalf("Purge = %d, %v", n, err)
	}
	_, err := a.Get(e.ctx, e.scope, kx)
	mustBe(e.t, "Get of an expired record after Purge", err, stores.ErrNotFound)
	e.mustBeDone("a live done record after Purge", e.get(a, e.scope, kd), nil)
	if n, err := a.Purge(e.ctx); err != nil || n != 0 {
		e.t.Fatalf("a second Purge = %d, %v; want nothing left to delete", n, err)
	}

	// A live claim stays, and so does one whose lease ran out less than
	// a lease ago: its takeover must still be reported as one.
	kl, kp := e.key("lapsed"), e.key("processing")
	cl := e.expect([]string{kl}, stores.Claimed)
	e.advance(e.lease() + e.lease()/2)
	cp := e.expect([]string{kp}, stores.Claimed)
	if _, err := a.Purge(e.ctx); err != nil {
		e.t.Fatalf("Purge: %v", err)
	}
	e.mustBeProcessing("a lapsed claim after Purge", e.get(a, e.scope, kl), cl.Token)
	e.mustBeProcessing("a live claim after Purge", e.get(a, e.scope, kp), cp.Token)
	if c := e.expect([]string{kl}, stores.Claimed); !c.Takeover {
		e.t.Fatal("the takeover of a lapsed claim kept by Purge is not reported")
	}
}

func testAdminInvalidInput(e *env, a stores.Admin) {
	k := e.key("a")
	e.done(e.scope, k, e.long(), nil)

	_, err := a.Get(e.ctx, e.scope, "")
	mustBe(e.t, "Get of an empty key", err, stores.ErrInvalidKey)
	_, err = a.Delete(e.ctx, e.scope, "", stores.StateDone)
	mustBe(e.t, "Delete of an empty key", err, stores.ErrInvalidKey)
	for _, st := range []stores.RecordState{0, 3, 255} {
		_, err = a.Delete(e.ctx, e.scope, k, st)
		mustBe(e.t, "Delete in state "+st.String(), err, stores.ErrInvalidArgument)
	}
	id := e.get(a, e.scope, k).ID
	for _, bad := range []string{"", "not an ID", "\x00\xff", id + "0", "x" + id} {
		_, err = a.GetByID(e.ctx, bad)
		if !errors.Is(err, stores.ErrInvalidArgument) && !errors.Is(err, stores.ErrNotFound) {
			e.t.Fatalf("GetByID(%q): got error %v, want one wrapping %v or %v", bad, err, stores.ErrInvalidArgument, stores.ErrNotFound)
		}
		_, err = a.DeleteByID(e.ctx, bad, stores.StateDone)
		if !errors.Is(err, stores.ErrInvalidArgument) && !errors.Is(err, stores.ErrNotFound) {
			e.t.Fatalf("DeleteByID(%q): got error %v, want one wrapping %v or %v", bad, err, stores.ErrInvalidArgument, stores.ErrNotFound)
		}
	}
	for _, bad := range []string{"", "not an ID", "\x00\xff"} {
		_, err = a.GetByID(e.ctx, bad)
		mustBe(e.t, "GetByID of "+strconv.Quote(bad), err, stores.ErrInvalidArgument)
	}
	for _, st := range []stores.RecordState{0, 3} {
		_, err = a.DeleteByID(e.ctx, id, st)
		mustBe(e.t, "DeleteByID in state "+st.String(), err, stores.ErrInvalidArgument)
	}
	for _, opts := range []stores.ListOptions{
		{Limit: -1}, {Limit: stores.MaxListLimit + 1}, {State: 3}, {After: "not a cursor"}, {After: "\x00\xff"},
	} {
		_, _, err = a.List(e.ctx, opts)
		mustBe(e.t, "List with bad options", err, stores.ErrInvalidArgument)
	}
	// None of that touched the record.
	e.expect([]string{k}, stores.Duplicate)

	done, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err = a.Get(done, e.scope, k)
	mustBe(e.t, "Get with a cancelled context", err, context.Canceled)
	_, _, err = a.List(done, stores.ListOptions{})
	mustBe(e.t, "List with a cancelled context", err, context.Canceled)
	_, err = a.Delete(done, e.scope, k, stores.StateDone)
	mustBe(e.t, "Delete with a cancelled context", err, context.Canceled)
	_, err = a.GetByID(done, id)
	mustBe(e.t, "GetByID with a cancelled context", err, context.Canceled)
	_, err = a.DeleteByID(done, id, stores.StateDone)
	mustBe(e.t, "DeleteByID with a cancelled context", err, context.Canceled)
	_, err = a.Stats(done)
	mustBe(e.t, "Stats with a cancelled context", err, context.Canceled)
	_, err = a.Purge(done)
	mustBe(e.t, "Purge with a cancelled context", err, context.Canceled)
	e.expect([]string{k}, stores.Duplicate)
}

func testAdminClosed(e *env, a stores.Admin) {
	k := e.key("a")
	e.done(e.scope, k, e.long(), nil)
	id := e.get(a, e.scope, k).ID
	if err := e.s.Close(e.ctx); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	_, err := a.Get(e.ctx, e.scope, k)
	mustBe(e.t, "Get after Close", err, stores.ErrClosed)
	_, _, err = a.List(e.ctx, stores.ListOptions{})
	mustBe(e.t, "List after Close", err, stores.ErrClosed)
	_, err = a.Delete(e.ctx, e.scope, k, stores.StateDone)
	mustBe(e.t, "Delete after Close", err, stores.ErrClosed)
	_, err = a.GetByID(e.ctx, id)
	mustBe(e.t, "GetByID after Close", err, stores.ErrClosed)
	_, err = a.DeleteByID(e.ctx, id, stores.StateDone)
	mustBe(e.t, "DeleteByID after Close", err, stores.ErrClosed)
	_, err = a.Stats(e.ctx)
	mustBe(e.t, "Stats after Close", err, stores.ErrClosed)
	_, err = a.Purge(e.ctx)
	mustBe(e.t, "Purge after Close", err, stores.ErrClosed)
}
