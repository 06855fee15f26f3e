package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// Factory returns a new, empty-or-shared store for one test. It registers
// its own cleanup (Close, dropping tables) with t.Cleanup. Stores that
// compute time in the process must use clock.
type Factory func(t *testing.T, clock stores.Clock) stores.Store

// Option changes how the suite runs.
type Option func(*options)

type options struct {
	realTime bool
	unit     time.Duration
	// serverTime moves the time of a store's records (see ServerTime);
	// realTime is then set too.
	serverTime func(t testing.TB, s stores.Store, d time.Duration)

	// Used by Run's admin tests only (see admin.go).
	adminNoScopes bool
	adminNoKeys   bool

	// Used by RunModel only; Run ignores them.
	precision   time.Duration
	maxKeyLen   int
	maxScopeLen int
	maxDuration time.Duration
	maxElapsed  time.Duration
	maintenance func(ctx context.Context, s stores.Store) error
	steps       int
}

// RealTime says the store ignores the injected clock (it keeps time on its
// server). The suite then uses leases of a few multiples of unit (default
// 250ms when unit is 0) and sleeps to let them pass.
func RealTime(unit time.Duration) Option {
	return func(o *options) {
		o.realTime = true
		if unit > 0 {
			o.unit = unit
		}
	}
}

// ServerTime says the store keeps time on its server, as [RealTime]
// does, and gives Run a way to move it: advance must make every record of
// s d older, as if d had passed on the store's clock (redisstore's tests
// shrink each key's TTL), or move the clock the factory made s with. The
// suite then gives leases and retentions of half an hour and more, which
// run out only when it moves time, and never sleeps: a slow machine
// cannot make a lease run out, or a record expire, before the suite says
// so. The times a store reports ([stores.Record], [stores.Stats]) stay
// its own: the suite compares them with the system clock only before it
// first moves time, and with each other only between two moves, allowing
// for the latency of the calls that reported them. Run only; RunModel
// takes RealTime.
func ServerTime(advance func(t testing.TB, s stores.Store, d time.Duration)) Option {
	return func(o *options) {
		o.realTime = true
		o.serverTime = advance
	}
}

// Precision is the store's time precision, for RunModel: the store
// keeps its clock at multiples of d and rounds durations up to it (see
// the Time section of the [stores] package doc). The default is one
// nanosecond; sqlstore passes time.Microsecond, redisstore
// time.Millisecond. d must divide one second.
func Precision(d time.Duration) Option {
	return func(o *options) { o.precision = d }
}

// MaxKeyLen is the longest key the store accepts, in bytes, for
// RunModel: a Claim with a longer key must fail with
// [stores.ErrInvalidKey]. The default, 0, means no bound: every key,
// the 1 MiB one RunModel tries included, must work as any other.
func MaxKeyLen(n int) Option {
	return func(o *options) { o.maxKeyLen = n }
}

// MaxScopeLen is the longest scope the store accepts, in bytes, for
// RunModel: a Claim in a longer scope must fail with
// [stores.ErrInvalidArgument]. The default, 0, means no bound.
func MaxScopeLen(n int) Option {
	return func(o *options) { o.maxScopeLen = n }
}

// MaxDuration is the store's documented bound on leases and retentions,
// for RunModel: a longer one must fail with [stores.ErrInvalidArgument]
// (sqlstore's daily partitions refuse more than PartitionDaysAhead
// days). The default, 0, means no bound: longer durations than the
// store can represent, up to math.MaxInt64, are capped, not refused.
func MaxDuration(d time.Duration) Option {
	return func(o *options) { o.maxDuration = d }
}

// MaxElapsed bounds how far RunModel moves the fake clock of one store
// from the time the store was made (a store whose records must expire
// within a window of that time, such as sqlstore's daily partitions,
// which the purge job creates ahead of time). The default, 0, means no
// bound.
func MaxElapsed(d time.Duration) Option {
	return func(o *options) { o.maxElapsed = d }
}

// Maintenance gives RunModel the store's own housekeeping (memstore's
// Sweep, sqlstore's Purge), which it then runs at random steps between
// the other calls. fn must not change what the contract promises: it may
// forget a record only when the contract lets the store forget it. An
// error it returns fails the test.
func Maintenance(fn func(ctx context.Context, s stores.Store) error) Option {
	return func(o *options) { o.maintenance = fn }
}

// ModelSteps makes RunModel run n steps in all, without its default
// bound on time. The environment variable STORETEST_MODEL_STEPS, when
// set, overrides it (for soak runs).
func ModelSteps(n int) Option {
	return func(o *options) { o.steps = n }
}

// suite is the state shared by the subtests of one Run.
type suite struct {
	t       *testing.T
	factory Factory
	opts    options
}

// env is one subtest's store, clock and unique names.
type env struct {
	t     *testing.T
	s     stores.Store
	clock *FakeClock
	opts  options
	scope string
	id    string
	ctx   context.Context
	// maxCall is the longest admin call seen (see timed).
	maxCall time.Duration
}

// Run runs the conformance suite against the stores newStore returns.
func Run(t *testing.T, newStore Factory, opts ...Option) {
	o := options{unit: 250 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	s := &suite{t: t, factory: newStore, opts: o}

	tests := []struct {
		name string
		fn   func(e *env)
	}{
		{"ClaimFresh", testClaimFresh},
		{"SecondClaimIsInProgress", testSecondClaimInProgress},
		{"CompleteThenDuplicate", testCompleteThenDuplicate},
		{"ReleaseThenReclaim", testReleaseThenReclaim},
		{"LeaseExpiryTakeover", testLeaseExpiryTakeover},
		{"RetentionExpiry", testRetentionExpiry},
		{"ExtendKeepsClaim", testExtendKeepsClaim},
		{"CompleteBesideExtend", testCompleteBesideExtend},
		{"FencingAfterComplete", testFencingAfterComplete},
		{"MultiKeyAllOrNothing", testMultiKeyAllOrNothing},
		{"DuplicateBeatsInProgress", testDuplicateBeatsInProgress},
		{"RepeatedKeys", testRepeatedKeys},
		{"ScopesIsolated", testScopesIsolated},
		{"NoCollisions", testNoCollisions},
		{"DataRoundTrip", testDataRoundTrip},
		{"InvalidInput", testInvalidInput},
		{"ConcurrentSameKey", testConcurrentSameKey},
		{"ConcurrentOverlappingKeys", testConcurrentOverlappingKeys},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(s.newEnv(t))
		})
	}
	for _, tc := range capabilitiesTests {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t)
			tc.fn(e, e.s.Capabilities())
		})
	}
	for _, tc := range adminTests {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t)
			tc.fn(e, e.admin())
		})
	}
	s.runOwners(t)
}

func (s *suite) newEnv(t *testing.T) *env {
	clock := NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	var c stores.Clock = clock
	if s.opts.realTime {
		c = stores.SystemClock{}
	}
	st := s.factory(t, c)
	id := NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &env{
		t:     t,
		s:     st,
		clock: clock,
		opts:  s.opts,
		scope: "storetest-" + id,
		id:    id,
		ctx:   ctx,
	}
}

// NewID returns a random 16-hex-digit id, for unique keys, prefixes and
// table names in tests.
func NewID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// lease is the lease the suite uses: long for a fake clock (only Advance
// moves it), longer still for a server's clock that the suite moves (real
// time passes too, and must not matter), a few units for real time.
func (e *env) lease() time.Duration {
	switch {
	case e.opts.serverTime != nil:
		return 30 * time.Minute
	case e.opts.realTime:
		return 4 * e.opts.unit
	}
	return 30 * time.Second
}

// retention is the retention the suite uses.
func (e *env) retention() time.Duration {
	switch {
	case e.opts.serverTime != nil:
		return 2 * time.Hour
	case e.opts.realTime:
		return 4 * e.opts.unit
	}
	return time.Hour
}

// advance lets d pass: on the fake clock, on the store's server (see
// ServerTime), or by sleeping.
func (e *env) advance(d time.Duration) {
	switch {
	case e.opts.serverTime != nil:
		e.opts.serverTime(e.t, e.s, d)
	case e.opts.realTime:
		time.Sleep(d)
	default:
		e.clock.Advance(d)
	}
}

func (e *env) key(name string) string { return e.id + ":" + name }

func (e *env) claim(keys ...string) *stores.Claim {
	e.t.Helper()
	return e.claimLease(e.lease(), keys...)
}

func (e *env) claimLease(lease time.Duration, keys ...string) *stores.Claim {
	e.t.Helper()
	c, err := e.s.Claim(e.ctx, e.scope, keys, lease)
	if err != nil {
		e.t.Fatalf("Claim(%q, %q): %v", e.scope, keys, err)
	}
	if c == nil {
		e.t.Fatalf("Claim(%q, %q) returned a nil claim and no error", e.scope, keys)
	}
	return c
}

func (e *env) mustResult(c *stores.Claim, want stores.Result) {
	e.t.Helper()
	if c.Result != want {
		e.t.Fatalf("Claim(%q) = %s, want %s", c.Keys, c.Result, want)
	}
	if want == stores.Claimed && c.Token == "" {
		e.t.Fatalf("Claim(%q) Claimed with an empty token", c.Keys)
	}
}

func (e *env) expect(keys []string, want stores.Result) *stores.Claim {
	e.t.Helper()
	c := e.claim(keys...)
	e.mustResult(c, want)
	return c
}

func (e *env) complete(c *stores.Claim, data []byte) {
	e.t.Helper()
	if err := e.s.Complete(e.ctx, c, e.retention(), data); err != nil {
		e.t.Fatalf("Complete(%q): %v", c.Keys, err)
	}
}

func (e *env) release(c *stores.Claim) {
	e.t.Helper()
	if err := e.s.Release(e.ctx, c); err != nil {
		e.t.Fatalf("Release(%q): %v", c.Keys, err)
	}
}

func mustBe(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one wrapping %v", what, err, target)
	}
}

func testClaimFresh(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	if c.Scope != e.scope || len(c.Keys) != 1 || c.Keys[0] != k {
		e.t.Fatalf("claim = {Scope:%q Keys:%q}, want {Scope:%q Keys:[%q]}", c.Scope, c.Keys, e.scope, k)
	}
	if c.Takeover {
		e.t.Fatal("a fresh claim reports Takeover")
	}
}

func testSecondClaimInProgress(e *env) {
	k := e.key("a")
	first := e.expect([]string{k}, stores.Claimed)
	second := e.expect([]string{k}, stores.InProgress)
	if second.Token != "" {
		e.t.Fatalf("InProgress claim carries token %q", second.Token)
	}
	// The InProgress claim changed nothing: the first owner still completes.
	e.complete(first, nil)
	e.expect([]string{k}, stores.Duplicate)
}

func testCompleteThenDuplicate(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	e.complete(c, []byte("outputs"))
	d := e.expect([]string{k}, stores.Duplicate)
	if string(d.Data) != "outputs" {
		e.t.Fatalf("Duplicate Data = %q, want %q", d.Data, "outputs")
	}
	if d.Token != "" {
		e.t.Fatalf("Duplicate claim carries token %q", d.Token)
	}
	// Still a duplicate later within retention.
	e.advance(e.retention() / 4)
	e.expect([]string{k}, stores.Duplicate)
}

func testReleaseThenReclaim(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	e.release(c)
	c2 := e.expect([]string{k}, stores.Claimed)
	if c2.Token == c.Token {
		e.t.Fatalf("reclaim reused token %q", c.Token)
	}
	if c2.Takeover {
		e.t.Fatal("a claim after Release reports Takeover")
	}
	// The released claim is stale now.
	mustBe(e.t, "Release of a released claim", e.s.Release(e.ctx, c), stores.ErrLostClaim)
	mustBe(e.t, "Complete of a released claim", e.s.Complete(e.ctx, c, e.retention(), nil), stores.ErrLostClaim)
	e.complete(c2, nil)
}

func testLeaseExpiryTakeover(e *env) {
	k := e.key("a")
	old := e.expect([]string{k}, stores.Claimed)
	e.advance(e.lease() + e.lease()/2)
	cur := e.expect([]string{k}, stores.Claimed)
	if !cur.Takeover {
		e.t.Fatal("claim of an expired lease does not report Takeover")
	}
	if cur.Token == old.Token {
		e.t.Fatalf("takeover reused token %q", old.Token)
	}
	// The old owner is fenced off: each call fails and changes nothing.
	mustBe(e.t, "stale Extend", e.s.Extend(e.ctx, old, e.lease()), stores.ErrLostClaim)
	mustBe(e.t, "stale Complete", e.s.Complete(e.ctx, old, e.retention(), []byte("stale")), stores.ErrLostClaim)
	mustBe(e.t, "stale Release", e.s.Release(e.ctx, old), stores.ErrLostClaim)
	e.expect([]string{k}, stores.InProgress)
	e.complete(cur, []byte("winner"))
	d := e.expect([]string{k}, stores.Duplicate)
	if string(d.Data) != "winner" {
		e.t.Fatalf("Data = %q after a stale Complete, want %q", d.Data, "winner")
	}
}

func testRetentionExpiry(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	e.complete(c, []byte("x"))
	e.advance(e.retention() / 2)
	e.expect([]string{k}, stores.Duplicate)
	e.advance(e.retention())
	c2 := e.expect([]string{k}, stores.Claimed)
	if len(c2.Data) != 0 {
		e.t.Fatalf("a fresh claim after retention carries Data %q", c2.Data)
	}
	// The expired done record is gone for good: the old claim is stale.
	mustBe(e.t, "Complete of the first claim after retention", e.s.Complete(e.ctx, c, e.retention(), nil), stores.ErrLostClaim)
	e.complete(c2, nil)
}

func testExtendKeepsClaim(e *env) {
	k := e.key("a")
	l := e.lease()
	c := e.expect([]string{k}, stores.Claimed)
	e.advance(l / 2)
	if err := e.s.Extend(e.ctx, c, l); err != nil {
		e.t.Fatalf("Extend: %v", err)
	}
	// Past the original lease, within the extended one.
	e.advance(l * 3 / 4)
	e.expect([]string{k}, stores.InProgress)
	if err := e.s.Extend(e.ctx, c, l); err != nil {
		e.t.Fatalf("second Extend: %v", err)
	}
	e.complete(c, nil)
	e.expect([]string{k}, stores.Duplicate)
	mustBe(e.t, "Extend of a completed claim", e.s.Extend(e.ctx, c, l), stores.ErrLostClaim)
	e.expect([]string{k}, stores.Duplicate)
}

// testCompleteBesideExtend: a claim's own calls may overlap — the
// middleware's heartbeat may have an Extend in flight when a Complete is
// sent, or the caller's code may — and neither is then a lost claim: the
// record is still the claim's. Each Complete succeeds, and each Extend
// succeeds or, once the Complete landed, fails with ErrLostClaim.
func testCompleteBesideExtend(e *env) {
	for i := range 20 {
		keys := []string{e.key(fmt.Sprintf("a%d", i))}
		if i%2 == 1 {
			keys = append(keys, e.key(fmt.Sprintf("b%d", i)))
		}
		c := e.expect(keys, stores.Claimed)
		stop := make(chan struct{})
		extended := make(chan error, 1)
		go func() {
			var err error
			for n := 0; err == nil; n++ {
				select {
				case <-stop:
					extended <- nil
					return
				default:
				}
				err = e.s.Extend(e.ctx, c, e.lease())
			}
			extended <- err
		}()
		err := e.s.Complete(e.ctx, c, e.retention(), []byte("beside"))
		close(stop)
		if err != nil {
			e.t.Fatalf("claim %d: Complete beside the claim's own Extends: %v", i, err)
		}
		if err := <-extended; err != nil && !errors.Is(err, stores.ErrLostClaim) {
			e.t.Fatalf("claim %d: Extend beside the claim's Complete: %v", i, err)
		}
		if d := e.expect(keys, stores.Duplicate); string(d.Data) != "beside" {
			e.t.Fatalf("claim %d: Data = %q", i, d.Data)
		}
	}
}

func testFencingAfterComplete(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	e.complete(c, []byte("first"))
	mustBe(e.t, "second Complete", e.s.Complete(e.ctx, c, e.retention(), []byte("second")), stores.ErrLostClaim)
	mustBe(e.t, "Release after Complete", e.s.Release(e.ctx, c), stores.ErrLostClaim)
	d := e.expect([]string{k}, stores.Duplicate)
	if string(d.Data) != "first" {
		e.t.Fatalf("Data = %q, want %q", d.Data, "first")
	}
}

func testMultiKeyAllOrNothing(e *env) {
	a, b, c, d := e.key("a"), e.key("b"), e.key("c"), e.key("d")
	ab := e.expect([]string{a, b}, stores.Claimed)
	// b is held: the claim of [c, b] fails and leaves c untouched.
	e.expect([]string{c, b}, stores.InProgress)
	cc := e.expect([]string{c}, stores.Claimed)
	e.release(cc)
	// Each key of the claim is held.
	e.expect([]string{a}, stores.InProgress)
	e.expect([]string{b}, stores.InProgress)

	e.complete(ab, []byte("ab"))
	// A claim sharing one done key is a Duplicate and claims nothing else.
	dup := e.expect([]string{d, b}, stores.Duplicate)
	if string(dup.Data) != "ab" {
		e.t.Fatalf("Data = %q, want %q", dup.Data, "ab")
	}
	dd := e.expect([]string{d}, stores.Claimed)
	e.release(dd)

	// Release of a multi-key claim frees every key.
	cd := e.expect([]string{c, d}, stores.Claimed)
	e.release(cd)
	e.release(e.expect([]string{c}, stores.Claimed))
	e.release(e.expect([]string{d}, stores.Claimed))

	// A stale multi-key claim changes none of its keys.
	l := e.lease()
	old := e.expect([]string{c, d}, stores.Claimed)
	e.advance(l + l/2)
	cur := e.expect([]string{d}, stores.Claimed)
	mustBe(e.t, "Complete of a half-taken-over claim", e.s.Complete(e.ctx, old, e.retention(), nil), stores.ErrLostClaim)
	e.expect([]string{d}, stores.InProgress)
	e.complete(cur, nil)
}

func testDuplicateBeatsInProgress(e *env) {
	a, b := e.key("a"), e.key("b")
	ca := e.expect([]string{a}, stores.Claimed)
	e.complete(ca, []byte("A"))
	e.expect([]string{b}, stores.Claimed)
	d := e.expect([]string{b, a}, stores.Duplicate)
	if string(d.Data) != "A" {
		e.t.Fatalf("Data = %q, want %q", d.Data, "A")
	}
}

func testRepeatedKeys(e *env) {
	a := e.key("a")
	c := e.expect([]string{a, a}, stores.Claimed)
	e.complete(c, nil)
	e.expect([]string{a}, stores.Duplicate)
}

func testScopesIsolated(e *env) {
	k := e.key("a")
	c := e.expect([]string{k}, stores.Claimed)
	e.complete(c, nil)
	other, err := e.s.Claim(e.ctx, e.scope+"-other", []string{k}, e.lease())
	if err != nil {
		e.t.Fatalf("Claim in another scope: %v", err)
	}
	e.mustResult(other, stores.Claimed)
	if err := e.s.Release(e.ctx, other); err != nil {
		e.t.Fatalf("Release in another scope: %v", err)
	}
	e.expect([]string{k}, stores.Duplicate)
}

func testNoCollisions(e *env) {
	// Pairs that a naive "scope:key" or "scope{key}" join would merge.
	long := strings.Repeat("x", 256)
	pairs := [][2]string{
		{e.scope + ":a", "b"},
		{e.scope, "a:b"},
		{e.scope + "{a", "}b"},
		{e.scope + "{a}", "b"},
		{e.scope + "\x00a", "b"},
		{e.scope, "\x00a\x00b"},
		{e.scope, "a\xffb"},
		{e.scope, "ключ-🔑"},
		{e.scope, long},
		{e.scope, long + "y"},
		{e.scope + "/", e.id},
		{e.scope, "/" + e.id},
	}
	claims := make([]*stores.Claim, len(pairs))
	for i, p := range pairs {
		c, err := e.s.Claim(e.ctx, p[0], []string{p[1]}, e.lease())
		if err != nil {
			e.t.Fatalf("Claim(scope %q, key %q): %v", p[0], p[1], err)
		}
		if c.Result != stores.Claimed {
			e.t.Fatalf("Claim(scope %q, key %q) = %s: it collides with an earlier pair", p[0], p[1], c.Result)
		}
		claims[i] = c
	}
	for i, c := range claims {
		e.complete(c, []byte(fmt.Sprint(i)))
	}
	for i, p := range pairs {
		c, err := e.s.Claim(e.ctx, p[0], []string{p[1]}, e.lease())
		if err != nil {
			e.t.Fatal(err)
		}
		if c.Result != stores.Duplicate || string(c.Data) != fmt.Sprint(i) {
			e.t.Fatalf("pair %d (scope %q, key %q): %s with Data %q, want duplicate with %d", i, p[0], p[1], c.Result, c.Data, i)
		}
	}
}

func testDataRoundTrip(e *env) {
	big := make([]byte, 64<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	cases := map[string][]byte{
		"nil":    nil,
		"empty":  {},
		"binary": {0, 1, 0xff, 0xfe, '\n', 0, '"', '\\', 0x80},
		"utf8":   []byte("κλειδί ✓"),
		"64KiB":  big,
	}
	for name, data := range cases {
		k := e.key("data-" + name)
		c := e.expect([]string{k}, stores.Claimed)
		e.complete(c, data)
		d := e.expect([]string{k}, stores.Duplicate)
		if !bytes.Equal(d.Data, data) {
			e.t.Fatalf("%s: Data round trip: got %d bytes, want %d (equal content)", name, len(d.Data), len(data))
		}
	}
}

func testInvalidInput(e *env) {
	ctx := e.ctx
	_, err := e.s.Claim(ctx, e.scope, nil, e.lease())
	mustBe(e.t, "Claim with no keys", err, stores.ErrInvalidKey)
	_, err = e.s.Claim(ctx, e.scope, []string{e.key("ok"), ""}, e.lease())
	mustBe(e.t, "Claim with an empty key", err, stores.ErrInvalidKey)
	// The valid key of the rejected claim was not claimed.
	e.release(e.expect([]string{e.key("ok")}, stores.Claimed))

	_, err = e.s.Claim(ctx, e.scope, []string{e.key("a")}, 0)
	mustBe(e.t, "Claim with a zero lease", err, stores.ErrInvalidArgument)
	_, err = e.s.Claim(ctx, e.scope, []string{e.key("a")}, -time.Second)
	mustBe(e.t, "Claim with a negative lease", err, stores.ErrInvalidArgument)

	c := e.expect([]string{e.key("a")}, stores.Claimed)
	mustBe(e.t, "Complete with a zero retention", e.s.Complete(ctx, c, 0, nil), stores.ErrInvalidArgument)
	mustBe(e.t, "Extend with a zero lease", e.s.Extend(ctx, c, 0), stores.ErrInvalidArgument)
	mustBe(e.t, "Complete(nil)", e.s.Complete(ctx, nil, e.retention(), nil), stores.ErrInvalidArgument)
	mustBe(e.t, "Release(nil)", e.s.Release(ctx, nil), stores.ErrInvalidArgument)
	mustBe(e.t, "Extend(nil)", e.s.Extend(ctx, nil, e.lease()), stores.ErrInvalidArgument)

	inProgress := e.expect([]string{e.key("a")}, stores.InProgress)
	mustBe(e.t, "Complete of an InProgress result", e.s.Complete(ctx, inProgress, e.retention(), nil), stores.ErrInvalidArgument)
	mustBe(e.t, "Release of an InProgress result", e.s.Release(ctx, inProgress), stores.ErrInvalidArgument)
	// None of that touched the real claim.
	e.complete(c, nil)
}

func testConcurrentSameKey(e *env) {
	const n = 64
	k := e.key("hot")
	var (
		claimed, inProgress atomic.Int32
		wg                  sync.WaitGroup
		start               = make(chan struct{})
		errs                = make(chan error, n)
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := e.s.Claim(e.ctx, e.scope, []string{k}, e.lease())
			if err != nil {
				errs <- err
				return
			}
			switch c.Result {
			case stores.Claimed:
				claimed.Add(1)
			case stores.InProgress:
				inProgress.Add(1)
			default:
				errs <- fmt.Errorf("unexpected result %s", c.Result)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("concurrent Claim: %v", err)
	}
	if claimed.Load() != 1 || inProgress.Load() != n-1 {
		e.t.Fatalf("%d concurrent claims: %d Claimed, %d InProgress; want 1 and %d", n, claimed.Load(), inProgress.Load(), n-1)
	}
}

// testConcurrentOverlappingKeys checks that multi-key claims are atomic
// under contention: no key is ever owned by two claims at once.
func testConcurrentOverlappingKeys(e *env) {
	keys := []string{e.key("k0"), e.key("k1"), e.key("k2"), e.key("k3")}
	var (
		mu     sync.Mutex
		held   = map[string]bool{}
		wins   atomic.Int32
		wg     sync.WaitGroup
		errs   = make(chan error, 64)
		rounds = 40
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				i := (w + r) % len(keys)
				j := (i + 1 + (w+r/3)%(len(keys)-1)) % len(keys)
				set := []string{keys[i], keys[j]}
				c, err := e.s.Claim(e.ctx, e.scope, set, e.lease())
				if err != nil {
					errs <- err
					return
				}
				if c.Result != stores.Claimed {
					continue
				}
				wins.Add(1)
				mu.Lock()
				for _, k := range set {
					if held[k] {
						mu.Unlock()
						errs <- fmt.Errorf("key %q claimed twice at once", k)
						return
					}
					held[k] = true
				}
				mu.Unlock()
				runtime.Gosched() // hold the keys while others try
				mu.Lock()
				for _, k := range set {
					held[k] = false
				}
				mu.Unlock()
				if err := e.s.Release(e.ctx, c); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
	if wins.Load() == 0 {
		e.t.Fatal("no claim ever succeeded")
	}
	for _, k := range keys {
		e.release(e.expect([]string{k}, stores.Claimed))
	}
}

func testClose(e *env) {
	c := e.expect([]string{e.key("a")}, stores.Claimed)
	if err := e.s.Close(e.ctx); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	if err := e.s.Close(e.ctx); err != nil {
		e.t.Fatalf("second Close: %v", err)
	}
	_, err := e.s.Claim(e.ctx, e.scope, []string{e.key("b")}, e.lease())
	mustBe(e.t, "Claim after Close", err, stores.ErrClosed)
	mustBe(e.t, "Complete after Close", e.s.Complete(e.ctx, c, e.retention(), nil), stores.ErrClosed)
	mustBe(e.t, "Release after Close", e.s.Release(e.ctx, c), stores.ErrClosed)
	mustBe(e.t, "Extend after Close", e.s.Extend(e.ctx, c, e.lease()), stores.ErrClosed)
}
