package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// InboxStore is a store with both modes: the transactional inbox
// ([stores.Inbox]) under test, and lease mode ([stores.Store]), which
// RunInbox uses to hold keys with a live lease and to Close the store.
type InboxStore interface {
	stores.Store
	stores.Inbox
}

// InboxFixture is what RunInbox needs of one Inbox store, in terms that
// any transactional store can give: the store, the handler's business
// write, a count of committed business writes and, optionally, a
// transaction of the caller's for Begin to join.
type InboxFixture struct {
	// Store is the store under test.
	Store InboxStore

	// WriteEffect is the handler's business write, named key: it writes
	// one row (or its equivalent) in the transaction that ctx carries,
	// so the row commits or rolls back with that transaction. The suite
	// calls it with contexts from [stores.InboxTx.Context] and from
	// [OuterTx.Context]. It must fail when ctx carries no transaction,
	// and must not deduplicate: two writes of one key are two effects.
	WriteEffect func(ctx context.Context, key string) error

	// CountEffects returns how many effects named key are committed, as
	// seen from outside any transaction.
	CountEffects func(ctx context.Context, key string) (int, error)

	// BeginOuter, when not nil, opens a transaction of the caller's on
	// the store's database, for Begin to join when given the context
	// [OuterTx.Context] returns (sqlstore.WithTx, for instance). The
	// suite then runs its tests a second time in joined mode, with every
	// Begin inside such a transaction. Nil means the store has no joined
	// mode: those tests are skipped.
	BeginOuter func(ctx context.Context) (OuterTx, error)

	// OuterExclusive says an outer transaction holds the whole database
	// for writing from its start (SQLite's BEGIN IMMEDIATE): a second one
	// waits in BeginOuter, not in the store's Begin. The suite then
	// never opens two at once, and skips in joined mode the tests that
	// need two transactions alive together.
	OuterExclusive bool

	// AbortOuter lists ways to make the database end an outer transaction
	// on its own, as it does on a deadlock (MySQL rolls all of it back)
	// or after a failed statement (PostgreSQL refuses the rest), while
	// the client still holds it open. Each runs the tests of a Begin and
	// a Commit joined to such a transaction. Empty means the store's
	// database offers none: those tests are skipped.
	AbortOuter []OuterAbort
}

// OuterTx is a transaction of the caller's that Begin joins in joined
// mode (see [InboxFixture.BeginOuter]).
type OuterTx interface {
	// Context returns parent carrying the transaction, for Begin to
	// join and for WriteEffect to write in.
	Context(parent context.Context) context.Context
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback rolls the transaction back. The suite calls it on every
	// outer transaction when a test ends, whatever became of it: after
	// Commit or Rollback it must do nothing (an error is ignored).
	Rollback(ctx context.Context) error
}

// OuterAbort is one way to make the database end an outer transaction
// (see [InboxFixture.AbortOuter]).
type OuterAbort struct {
	// Name names the way in test names: "deadlock", "failed-statement".
	Name string
	// Abort makes the database end tx on its own and returns once it
	// has: tx is then unusable on the server but still open on the
	// client, as a handler that hit the failure and ignored it would
	// leave it. It returns an error when it could not do so.
	Abort func(ctx context.Context, tx OuterTx) error
}

// InboxFactory returns the fixture of a new store for one test, with its
// own clean tables (or keys no other test uses). It registers its own
// cleanup (Close, dropping tables) with t.Cleanup. A store that computes
// time in the process must use clock.
type InboxFactory func(t *testing.T, clock stores.Clock) InboxFixture

// InboxOption changes how RunInbox runs.
type InboxOption func(*inboxOptions)

type inboxOptions struct {
	realTime bool
	unit     time.Duration
}

// InboxRealTime says the store ignores the injected clock (it keeps time
// on its server). The suite then uses retentions and leases of a few
// multiples of unit (default 250ms when unit is 0) and sleeps to let
// them pass, as [RealTime] does for Run.
func InboxRealTime(unit time.Duration) InboxOption {
	return func(o *inboxOptions) {
		o.realTime = true
		if unit > 0 {
			o.unit = unit
		}
	}
}

// The suite's timings.
const (
	// inboxWaitCheck is how long a Begin of a held key must stay blocked.
	inboxWaitCheck = 100 * time.Millisecond
	// inboxWaitDeadline is the ctx deadline of a Begin waiting on a held
	// key, and inboxWaitSlack how much later it may return.
	inboxWaitDeadline = 150 * time.Millisecond
	inboxWaitSlack    = 2 * time.Second
	// inboxConcurrency is how many Begins of one key run at once.
	inboxConcurrency = 16
)

// RunInbox runs the conformance suite of [stores.Inbox] against the
// stores newFixture returns: first with Begin opening its own
// transaction ("Own"), then, when the fixture has BeginOuter, with every
// Begin joined to an outer transaction of the test's ("Joined"). A SQL
// store wires it as:
//
//	func TestInboxConformance(t *testing.T) {
//		storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
//			s := newStore(t, db, Config{Clock: clock})     // dropped by t.Cleanup
//			effects := newEffectsTable(t, db)              // likewise
//			return storetest.InboxFixture{
//				Store:        s,
//				WriteEffect:  effects.insert,   // in TxFromContext(ctx)
//				CountEffects: effects.count,
//				BeginOuter:   beginOuter(db),   // optional
//			}
//		})
//	}
//
// The tests check what the contract of [stores.Inbox] and
// [stores.InboxTx] promises:
//
//   - ClaimCommitDuplicate: Begin on fresh keys is Claimed; the effect
//     and the record commit together, not before Commit (in joined mode,
//     not before the outer commit); a later Begin is Duplicate with the
//     committed data; Commit and Rollback of a Duplicate do nothing.
//   - RollbackUndoes: Rollback undoes record and effect, and a later
//     Begin is Claimed; Rollback after Commit or Rollback does nothing;
//     a second Commit, and a Commit after Rollback, fail and commit
//     nothing.
//   - DataRoundTrip: the Data of a Duplicate is what Commit stored.
//   - MultiKeyAllOrNothing, RepeatedKeys, ScopesIsolated.
//   - LeaseClaimInProgress: a key held by a live lease-mode Claim makes
//     Begin InProgress and changes nothing; a done key beats it; an
//     expired lease is taken over and its owner fenced off.
//   - ExpiredRecordReplaced: a done record past its retention is
//     replaced by a Begin that is Claimed.
//   - ConcurrentBeginWaits: a Begin of a key held by an open transaction
//     waits for it, then reports Duplicate (it committed) or Claimed (it
//     rolled back).
//   - ConcurrentSameKey: many Begins of one key at once, the first
//     claimant's handler failing, make exactly one effect; the others are
//     Duplicates.
//   - BeginWaitBoundedByContext: a Begin waiting on a held key fails
//     with its ctx's error soon after its deadline and leaves nothing
//     behind.
//   - InvalidInput, Closed, ContextDone: bad input fails with
//     [stores.ErrInvalidKey] or [stores.ErrInvalidArgument], a closed
//     store with [stores.ErrClosed], a ctx already done with its error;
//     each writes nothing and, in joined mode, leaves the outer
//     transaction usable.
//   - CommitContextDone: Commit with a ctx already done fails with its
//     error and commits nothing; with a ctx that ends during Commit the
//     outcome may be either, but record and effect commit together or
//     not at all, and a nil error means committed.
//   - Joined only: JoinedHandlerError (a rolled-back attempt leaves the
//     outer transaction usable, and the outer commit commits the outer's
//     own writes and the committed attempts only), JoinedOuterRollback,
//     and JoinedTxAborted (per [InboxFixture.AbortOuter]: Begin and
//     Commit in a transaction the database ended fail with
//     [stores.ErrTxAborted], and nothing is committed outside a
//     transaction).
//
// In joined mode, a Begin that fails is followed by a commit of its
// outer transaction: Begin must have left nothing in it.
func RunInbox(t *testing.T, newFixture InboxFactory, opts ...InboxOption) {
	o := inboxOptions{unit: 250 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	s := &inboxSuite{factory: newFixture, opts: o}

	type test struct {
		name string
		fn   func(e *inboxEnv)
		// joinedOnly tests run in joined mode only; twoTx tests need two
		// transactions alive at once (skipped in joined mode when
		// OuterExclusive).
		joinedOnly, twoTx bool
	}
	tests := []test{
		{name: "ClaimCommitDuplicate", fn: testInboxClaimCommitDuplicate},
		{name: "RollbackUndoes", fn: testInboxRollbackUndoes},
		{name: "DataRoundTrip", fn: testInboxDataRoundTrip},
		{name: "MultiKeyAllOrNothing", fn: testInboxMultiKey},
		{name: "RepeatedKeys", fn: testInboxRepeatedKeys},
		{name: "ScopesIsolated", fn: testInboxScopesIsolated},
		{name: "LeaseClaimInProgress", fn: testInboxLeaseInProgress},
		{name: "ExpiredRecordReplaced", fn: testInboxExpiredReplaced},
		{name: "ConcurrentBeginWaits", fn: testInboxBeginWaits, twoTx: true},
		{name: "ConcurrentSameKey", fn: testInboxConcurrentSameKey, twoTx: true},
		{name: "BeginWaitBoundedByContext", fn: testInboxWaitBounded, twoTx: true},
		{name: "InvalidInput", fn: testInboxInvalidInput},
		{name: "Closed", fn: testInboxClosed},
		{name: "ContextDone", fn: testInboxContextDone},
		{name: "CommitContextDone", fn: testInboxCommitContextDone},
		{name: "JoinedHandlerError", fn: testInboxJoinedHandlerError, joinedOnly: true},
		{name: "JoinedOuterRollback", fn: testInboxJoinedOuterRollback, joinedOnly: true},
		{name: "JoinedTxAborted", fn: testInboxJoinedTxAborted, joinedOnly: true},
	}
	t.Run("Own", func(t *testing.T) {
		for _, tc := range tests {
			if tc.joinedOnly {
				continue
			}
			t.Run(tc.name, func(t *testing.T) { tc.fn(s.newEnv(t, false)) })
		}
	})
	t.Run("Joined", func(t *testing.T) {
		noJoined := false
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if noJoined {
					t.Skip("the fixture has no BeginOuter: the store has no joined mode")
				}
				e := s.newEnv(t, true)
				if e.fx.BeginOuter == nil {
					noJoined = true
					t.Skip("the fixture has no BeginOuter: the store has no joined mode")
				}
				if tc.twoTx && e.fx.OuterExclusive {
					t.Skip("an outer transaction holds the whole database (InboxFixture.OuterExclusive): no second transaction can run alongside it")
				}
				tc.fn(e)
			})
		}
	})
}

type inboxSuite struct {
	factory InboxFactory
	opts    inboxOptions
}

// inboxEnv is one test's fixture, clock, mode and unique names.
type inboxEnv struct {
	t      *testing.T
	fx     InboxFixture
	joined bool
	clock  *FakeClock
	opts   inboxOptions
	scope  string
	id     string
	ctx    context.Context
	open   *inboxOpenTxs
	// ret, when positive, is the retention of the Begins.
	ret time.Duration
}

// inboxOpenTxs tracks every InboxTx and OuterTx a test began, to end them when
// it ends, passed or failed: an open transaction would hold locks (and
// connections) that the fixture's cleanup needs to drop its tables.
type inboxOpenTxs struct {
	mu     sync.Mutex
	inbox  []stores.InboxTx
	outers []OuterTx
}

func (o *inboxOpenTxs) addInbox(tx stores.InboxTx) {
	o.mu.Lock()
	o.inbox = append(o.inbox, tx)
	o.mu.Unlock()
}

func (o *inboxOpenTxs) addOuter(tx OuterTx) {
	o.mu.Lock()
	o.outers = append(o.outers, tx)
	o.mu.Unlock()
}

func (o *inboxOpenTxs) rollbackAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tx := range o.inbox {
		_ = tx.Rollback(ctx)
	}
	for _, tx := range o.outers {
		_ = tx.Rollback(ctx)
	}
	o.inbox, o.outers = nil, nil
}

func (s *inboxSuite) newEnv(t *testing.T, joined bool) *inboxEnv {
	clock := NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	var c stores.Clock = clock
	if s.opts.realTime {
		c = stores.SystemClock{}
	}
	fx := s.factory(t, c)
	if fx.Store == nil || fx.WriteEffect == nil || fx.CountEffects == nil {
		t.Fatal("storetest: the InboxFixture needs Store, WriteEffect and CountEffects")
	}
	id := NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	open := &inboxOpenTxs{}
	// Registered after the factory's cleanup, so it runs before it.
	t.Cleanup(open.rollbackAll)
	return &inboxEnv{
		t:      t,
		fx:     fx,
		joined: joined,
		clock:  clock,
		opts:   s.opts,
		scope:  "storetest-inbox-" + id,
		id:     id,
		ctx:    ctx,
		open:   open,
	}
}

// sub is e for a subtest t of e's test.
func (e *inboxEnv) sub(t *testing.T) *inboxEnv {
	c := *e
	c.t = t
	c.open = &inboxOpenTxs{}
	t.Cleanup(c.open.rollbackAll)
	return &c
}

func (e *inboxEnv) key(name string) string { return e.id + ":" + name }

// retention is the retention of the Begins: an hour, unless the test
// set a short one (see expiring).
func (e *inboxEnv) retention() time.Duration {
	if e.ret > 0 {
		return e.ret
	}
	return time.Hour
}

// expiring is a retention or lease that a test lets pass: long on a fake
// clock (only advance moves it), a few units in real time.
func (e *inboxEnv) expiring() time.Duration {
	if e.opts.realTime {
		return 4 * e.opts.unit
	}
	return 30 * time.Second
}

func (e *inboxEnv) advance(d time.Duration) {
	if e.opts.realTime {
		time.Sleep(d)
		return
	}
	e.clock.Advance(d)
}

func (e *inboxEnv) mode() string {
	if e.joined {
		return "joined Begin"
	}
	return "Begin"
}

// must fails the test with what and err unless err is nil.
func (e *inboxEnv) must(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// openOuter opens an outer transaction (joined mode).
func (e *inboxEnv) openOuter() (OuterTx, error) {
	outer, err := e.fx.BeginOuter(e.ctx)
	if err != nil {
		return nil, fmt.Errorf("InboxFixture.BeginOuter: %w", err)
	}
	if outer == nil {
		return nil, errors.New("InboxFixture.BeginOuter returned neither a transaction nor an error")
	}
	e.open.addOuter(outer)
	return outer, nil
}

func (e *inboxEnv) mustOuter() OuterTx {
	e.t.Helper()
	outer, err := e.openOuter()
	e.must("opening an outer transaction", err)
	return outer
}

// inboxAttempt is one message's attempt: its InboxTx and, in joined
// mode, the outer transaction it joined.
type inboxAttempt struct {
	e     *inboxEnv
	keys  []string
	label string // the effect's name
	tx    stores.InboxTx
	// outer is the joined transaction (nil in own mode); ownsOuter says
	// the attempt opened it and ends it.
	outer     OuterTx
	ownsOuter bool
}

// parent is the context the handler's context derives from.
func (a *inboxAttempt) parent() context.Context {
	if a.outer != nil {
		return a.outer.Context(a.e.ctx)
	}
	return a.e.ctx
}

// tryBegin begins an attempt of keys in scope with ctx bounding Begin:
// in own mode Begin alone, in joined mode inside a new outer transaction,
// which is committed at once when Begin fails (Begin must have left
// nothing in it).
func (e *inboxEnv) tryBegin(ctx context.Context, scope string, keys ...string) (*inboxAttempt, error) {
	if !e.joined {
		return e.beginWith(ctx, nil, false, scope, keys)
	}
	outer, err := e.openOuter()
	if err != nil {
		return nil, err
	}
	a, err := e.beginWith(ctx, outer, true, scope, keys)
	if err != nil {
		_ = outer.Commit(e.ctx)
		return nil, err
	}
	return a, nil
}

// beginIn begins an attempt inside outer, which the caller ends.
func (e *inboxEnv) beginIn(ctx context.Context, outer OuterTx, keys ...string) (*inboxAttempt, error) {
	return e.beginWith(ctx, outer, false, e.scope, keys)
}

func (e *inboxEnv) beginWith(ctx context.Context, outer OuterTx, owns bool, scope string, keys []string) (*inboxAttempt, error) {
	a := &inboxAttempt{e: e, keys: keys, label: strings.Join(keys, ","), outer: outer, ownsOuter: owns}
	bctx := ctx
	if outer != nil {
		bctx = outer.Context(ctx)
	}
	tx, err := e.fx.Store.Begin(bctx, scope, keys, e.retention())
	if err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, fmt.Errorf("Begin(%q) returned neither an InboxTx nor an error", keys)
	}
	e.open.addInbox(tx)
	a.tx = tx
	return a, nil
}

// expect begins an attempt of keys in e's scope and fails the test unless
// its result is want. An attempt that is not Claimed is finished (see
// finish) before expect returns.
func (e *inboxEnv) expect(want stores.Result, keys ...string) *inboxAttempt {
	e.t.Helper()
	a, err := e.tryBegin(e.ctx, e.scope, keys...)
	if err != nil {
		e.t.Fatalf("%s(%q): %v", e.mode(), keys, err)
	}
	e.mustResult(a, want)
	return a
}

// expectIn is expect inside outer.
func (e *inboxEnv) expectIn(outer OuterTx, want stores.Result, keys ...string) *inboxAttempt {
	e.t.Helper()
	a, err := e.beginIn(e.ctx, outer, keys...)
	if err != nil {
		e.t.Fatalf("%s(%q) in the outer transaction: %v", e.mode(), keys, err)
	}
	e.mustResult(a, want)
	return a
}

func (e *inboxEnv) mustResult(a *inboxAttempt, want stores.Result) {
	e.t.Helper()
	if got := a.tx.Result(); got != want {
		e.t.Fatalf("%s(%q) = %s, want %s", e.mode(), a.keys, got, want)
	}
	if want != stores.Claimed {
		e.must(fmt.Sprintf("%s(%q) (%s)", e.mode(), a.keys, want), a.finish())
	}
}

// effect runs the handler's write in the attempt's transaction.
func (a *inboxAttempt) effect() error {
	if err := a.e.fx.WriteEffect(a.tx.Context(a.parent()), a.label); err != nil {
		return fmt.Errorf("the handler's write in the context of a Claimed InboxTx: %w", err)
	}
	return nil
}

// commit commits the attempt with data, then its outer transaction if it
// owns one.
func (a *inboxAttempt) commit(data []byte) error {
	if err := a.tx.Commit(a.e.ctx, data); err != nil {
		return fmt.Errorf("Commit: %w", err)
	}
	return a.endOuter(true)
}

// rollback rolls the attempt back, then commits its outer transaction if
// it owns one: the outer commit must commit nothing of the attempt's.
func (a *inboxAttempt) rollback() error {
	if err := a.tx.Rollback(a.e.ctx); err != nil {
		return fmt.Errorf("Rollback: %w", err)
	}
	return a.endOuter(true)
}

// endOuter commits (or rolls back) the outer transaction the attempt
// owns; it does nothing otherwise.
func (a *inboxAttempt) endOuter(commit bool) error {
	if !a.ownsOuter {
		return nil
	}
	a.ownsOuter = false
	if !commit {
		_ = a.outer.Rollback(a.e.ctx)
		return nil
	}
	if err := a.outer.Commit(a.e.ctx); err != nil {
		return fmt.Errorf("committing the outer transaction: %w", err)
	}
	return nil
}

// abandon ends the attempt and its outer transaction, ignoring errors:
// for a test that is failing.
func (a *inboxAttempt) abandon() {
	_ = a.tx.Rollback(a.e.ctx)
	_ = a.endOuter(false)
}

// finish ends an attempt that is not Claimed: its Commit (with data that
// must not be stored) and Rollback must both be no-ops without error.
func (a *inboxAttempt) finish() error {
	res := a.tx.Result()
	if err := a.tx.Commit(a.e.ctx, []byte("storetest: Commit of a "+res.String()+" result stored this")); err != nil {
		return fmt.Errorf("Commit of a %s result: %w (want a no-op)", res, err)
	}
	if err := a.tx.Rollback(a.e.ctx); err != nil {
		return fmt.Errorf("Rollback of a %s result: %w (want a no-op)", res, err)
	}
	return a.endOuter(true)
}

// effects returns the number of committed effects named label.
func (e *inboxEnv) effects(label string) int {
	e.t.Helper()
	n, err := e.fx.CountEffects(e.ctx, label)
	e.must("InboxFixture.CountEffects", err)
	return n
}

func (e *inboxEnv) wantEffects(label string, want int, when string) {
	e.t.Helper()
	if got := e.effects(label); got != want {
		e.t.Fatalf("%d committed effects %q %s, want %d", got, label, when, want)
	}
}

// wantDuplicate expects keys to be a Duplicate with data.
func (e *inboxEnv) wantDuplicate(data string, keys ...string) {
	e.t.Helper()
	d := e.expect(stores.Duplicate, keys...)
	if got := string(d.tx.Data()); got != data {
		e.t.Fatalf("%s(%q) is a Duplicate with Data %q, want %q", e.mode(), keys, got, data)
	}
}

// wantFree expects keys to have no record: a Begin of them is Claimed
// (and is rolled back).
func (e *inboxEnv) wantFree(why string, keys ...string) {
	e.t.Helper()
	a, err := e.tryBegin(e.ctx, e.scope, keys...)
	if err != nil {
		e.t.Fatalf("%s(%q): %v", e.mode(), keys, err)
	}
	res := a.tx.Result()
	if res != stores.Claimed {
		a.abandon()
		e.t.Fatalf("%s(%q) = %s, want claimed: %s", e.mode(), keys, res, why)
	}
	e.must("rolling the probe back", a.rollback())
}

func testInboxClaimCommitDuplicate(e *inboxEnv) {
	k := e.key("a")
	a := e.expect(stores.Claimed, k)
	e.must("", a.effect())
	e.wantEffects(a.label, 0, "before Commit")
	e.must("Commit", a.tx.Commit(e.ctx, []byte("out")))
	if e.joined {
		e.wantEffects(a.label, 0, "before the outer transaction commits")
		e.must("", a.endOuter(true))
	}
	e.wantEffects(a.label, 1, "after Commit")
	// A Duplicate's Commit (finish stores other data) and Rollback change
	// nothing.
	e.wantDuplicate("out", k)
	e.wantDuplicate("out", k)
	e.wantEffects(a.label, 1, "after the Duplicates")
}

func testInboxRollbackUndoes(e *inboxEnv) {
	k, k2 := e.key("a"), e.key("b")
	a := e.expect(stores.Claimed, k)
	e.must("", a.effect())
	e.must("", a.rollback())
	e.wantEffects(a.label, 0, "after Rollback")
	if err := a.tx.Rollback(e.ctx); err != nil {
		e.t.Fatalf("second Rollback: %v, want a no-op", err)
	}
	if err := a.tx.Commit(e.ctx, []byte("late")); err == nil {
		e.t.Fatal("Commit after Rollback returned nil: the caller would take the message for committed")
	}

	b := e.expect(stores.Claimed, k) // the rolled-back record is gone
	e.must("", b.effect())
	e.must("", b.commit([]byte("second")))
	if err := b.tx.Rollback(e.ctx); err != nil {
		e.t.Fatalf("Rollback after Commit: %v, want a no-op", err)
	}
	if err := b.tx.Commit(e.ctx, []byte("third")); err == nil {
		e.t.Fatal("second Commit returned nil, want an error")
	}
	e.wantEffects(b.label, 1, "after Rollback, Claimed again, Commit")
	e.wantDuplicate("second", k)

	// A multi-key Rollback frees every key.
	c := e.expect(stores.Claimed, k2, e.key("c"))
	e.must("", c.effect())
	e.must("", c.rollback())
	e.wantEffects(c.label, 0, "after Rollback")
	e.wantFree("its Begin was rolled back", k2)
	e.wantFree("its Begin was rolled back", e.key("c"))
}

func testInboxDataRoundTrip(e *inboxEnv) {
	big := make([]byte, 64<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"binary", []byte{0, 1, 0xff, 0xfe, '\n', 0, '"', '\'', '\\', 0x80}},
		{"utf8", []byte("κλειδί ✓")},
		{"64KiB", big},
	}
	for _, c := range cases {
		k := e.key("data-" + c.name)
		a := e.expect(stores.Claimed, k)
		e.must("", a.commit(c.data))
		d := e.expect(stores.Duplicate, k)
		if !bytes.Equal(d.tx.Data(), c.data) {
			e.t.Fatalf("%s: Data of the Duplicate: %d bytes, want %d (equal content)", c.name, len(d.tx.Data()), len(c.data))
		}
	}
}

func testInboxMultiKey(e *inboxEnv) {
	a, b, c, d := e.key("a"), e.key("b"), e.key("c"), e.key("d")
	ab := e.expect(stores.Claimed, a, b)
	e.must("", ab.effect())
	e.must("", ab.commit([]byte("ab")))
	// A Begin sharing one done key is a Duplicate and records no other.
	e.wantDuplicate("ab", c, b)
	e.wantDuplicate("ab", a, c)
	e.wantDuplicate("ab", b)
	e.wantFree("a Duplicate multi-key Begin records none of its keys", c)
	// A rolled-back multi-key Begin frees every key; a committed one
	// makes every key a Duplicate.
	cd := e.expect(stores.Claimed, c, d)
	e.must("", cd.effect())
	e.must("", cd.rollback())
	e.wantFree("a rolled-back multi-key Begin records none of its keys", c)
	e.wantFree("a rolled-back multi-key Begin records none of its keys", d)
	cd = e.expect(stores.Claimed, d, c)
	e.must("", cd.commit([]byte("dc")))
	e.wantDuplicate("dc", c)
	e.wantDuplicate("dc", d)
	e.wantEffects(ab.label, 1, "after its commit")
	e.wantEffects(c+","+d, 0, "after its rollback")
}

func testInboxRepeatedKeys(e *inboxEnv) {
	k := e.key("a")
	a := e.expect(stores.Claimed, k, k)
	e.must("", a.effect())
	e.must("", a.commit([]byte("once")))
	e.wantDuplicate("once", k)
	e.wantDuplicate("once", k, k)
	e.wantEffects(a.label, 1, "after Commit")
}

func testInboxScopesIsolated(e *inboxEnv) {
	k := e.key("a")
	e.must("", e.expect(stores.Claimed, k).commit([]byte("mine")))
	other, err := e.tryBegin(e.ctx, e.scope+"-other", k)
	if err != nil {
		e.t.Fatalf("%s of the same key in another scope: %v", e.mode(), err)
	}
	if res := other.tx.Result(); res != stores.Claimed {
		other.abandon()
		e.t.Fatalf("%s of the same key in another scope = %s, want claimed", e.mode(), res)
	}
	e.must("", other.commit([]byte("other")))
	e.wantDuplicate("mine", k)
}

func testInboxLeaseInProgress(e *inboxEnv) {
	k, f, dn, m := e.key("leased"), e.key("fresh"), e.key("done"), e.key("expiring")
	c, err := e.fx.Store.Claim(e.ctx, e.scope, []string{k}, time.Hour)
	if err != nil || c == nil || c.Result != stores.Claimed {
		e.t.Fatalf("lease-mode Claim(%q) = %+v, %v; want Claimed", k, c, err)
	}
	e.expect(stores.InProgress, k)
	e.expect(stores.InProgress, f, k)
	e.wantFree("an InProgress multi-key Begin records none of its keys", f)
	// A done key beats a key in progress.
	e.must("", e.expect(stores.Claimed, dn).commit([]byte("dn")))
	e.wantDuplicate("dn", k, dn)
	// The InProgress Begins changed nothing: the lease owner completes.
	e.must("lease-mode Complete after the InProgress Begins", e.fx.Store.Complete(e.ctx, c, e.retention(), []byte("lease")))
	e.wantDuplicate("lease", k)

	// An expired lease is taken over by Begin, and its owner fenced off.
	old, err := e.fx.Store.Claim(e.ctx, e.scope, []string{m}, e.expiring())
	if err != nil || old == nil || old.Result != stores.Claimed {
		e.t.Fatalf("lease-mode Claim(%q) = %+v, %v; want Claimed", m, old, err)
	}
	e.advance(e.expiring() + e.expiring()/2)
	a := e.expect(stores.Claimed, m)
	e.must("", a.effect())
	e.must("", a.commit([]byte("inbox")))
	mustBe(e.t, "lease-mode Complete of a lease Begin took over", e.fx.Store.Complete(e.ctx, old, e.retention(), []byte("stale")), stores.ErrLostClaim)
	e.wantDuplicate("inbox", m)
}

func testInboxExpiredReplaced(e *inboxEnv) {
	e.ret = e.expiring()
	k := e.key("a")
	a := e.expect(stores.Claimed, k)
	e.must("", a.effect())
	e.must("", a.commit([]byte("first")))
	e.advance(e.retention() / 2)
	e.wantDuplicate("first", k)
	e.advance(e.retention())
	b := e.expect(stores.Claimed, k)
	e.must("", b.effect())
	e.must("", b.commit(nil))
	e.wantDuplicate("", k)
	e.wantEffects(a.label, 2, "after a Commit, expiry and another Commit")
}

// inboxBeginResult is what a Begin run in a goroutine returns.
type inboxBeginResult struct {
	a   *inboxAttempt
	err error
}

func (e *inboxEnv) goBegin(ctx context.Context, keys ...string) <-chan inboxBeginResult {
	ch := make(chan inboxBeginResult, 1)
	go func() {
		a, err := e.tryBegin(ctx, e.scope, keys...)
		ch <- inboxBeginResult{a, err}
	}()
	return ch
}

func testInboxBeginWaits(e *inboxEnv) {
	for _, commit := range []bool{true, false} {
		k := e.key(fmt.Sprintf("held-%v", commit))
		first := e.expect(stores.Claimed, k)
		e.must("", first.effect())
		second := e.goBegin(e.ctx, k)
		select {
		case r := <-second:
			first.abandon()
			if r.a != nil {
				r.a.abandon()
			}
			e.t.Fatalf("a second %s(%q) returned (%v) while the first's transaction was open, want it to wait", e.mode(), k, r.err)
		case <-time.After(inboxWaitCheck):
		}
		if commit {
			e.must("", first.commit([]byte("first")))
		} else {
			e.must("", first.rollback())
		}
		r := <-second
		if r.err != nil {
			e.t.Fatalf("second %s(%q) after the first ended: %v", e.mode(), k, r.err)
		}
		res := r.a.tx.Result()
		switch {
		case commit && res == stores.Duplicate:
			if string(r.a.tx.Data()) != "first" {
				e.t.Fatalf("second %s(%q) after the first committed: Data %q, want %q", e.mode(), k, r.a.tx.Data(), "first")
			}
			e.must("", r.a.finish())
		case !commit && res == stores.Claimed:
			e.must("", r.a.effect())
			e.must("", r.a.commit([]byte("second")))
		default:
			r.a.abandon()
			e.t.Fatalf("second %s(%q) after the first %s = %s", e.mode(), k, map[bool]string{true: "committed", false: "rolled back"}[commit], res)
		}
		e.wantEffects(first.label, 1, "after both")
	}
}

func testInboxConcurrentSameKey(e *inboxEnv) {
	const n = inboxConcurrency
	k := e.key("hot")
	var (
		committed, rolledBack, duplicates atomic.Int32
		failedOnce                        atomic.Bool
		wg                                sync.WaitGroup
		start                             = make(chan struct{})
		errs                              = make(chan error, n)
	)
	// worker is one delivery: Begin; on Claimed run the handler (the
	// first claimant's fails: Rollback, then the delivery is retried) and
	// Commit; on Duplicate ack.
	worker := func() error {
		<-start
		for attempt := 1; ; attempt++ {
			a, err := e.tryBegin(e.ctx, e.scope, k)
			if err != nil {
				// In joined mode a deadlock may end the outer
				// transaction: the owner retries in a new one.
				if e.joined && errors.Is(err, stores.ErrTxAborted) && attempt < 10 {
					continue
				}
				return fmt.Errorf("%s: %w", e.mode(), err)
			}
			switch res := a.tx.Result(); res {
			case stores.Claimed:
				if err := a.effect(); err != nil {
					a.abandon()
					return err
				}
				if failedOnce.CompareAndSwap(false, true) {
					rolledBack.Add(1)
					if err := a.rollback(); err != nil {
						return err
					}
					continue
				}
				if err := a.commit([]byte("winner")); err != nil {
					return err
				}
				committed.Add(1)
				return nil
			case stores.Duplicate:
				duplicates.Add(1)
				if string(a.tx.Data()) != "winner" {
					a.abandon()
					return fmt.Errorf("a Duplicate with Data %q, want %q", a.tx.Data(), "winner")
				}
				return a.finish()
			default:
				a.abandon()
				return fmt.Errorf("%s(%q) = %s, want claimed or duplicate", e.mode(), k, res)
			}
		}
	}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := worker(); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Error(err)
	}
	if e.t.Failed() {
		return
	}
	if committed.Load() != 1 || rolledBack.Load() != 1 || duplicates.Load() != n-1 {
		e.t.Fatalf("%d concurrent deliveries of one key: %d committed, %d rolled back, %d duplicates; want 1, 1 and %d", n, committed.Load(), rolledBack.Load(), duplicates.Load(), n-1)
	}
	e.wantEffects(k, 1, fmt.Sprintf("after %d concurrent deliveries", n))
	e.wantDuplicate("winner", k)
}

func testInboxWaitBounded(e *inboxEnv) {
	held := e.key("held")
	holder := e.expect(stores.Claimed, held)
	// Fresh keys with the held one: a store that records them before it
	// waits must undo them when its ctx ends.
	keys := []string{held}
	for i := range 8 {
		keys = append(keys, e.key(fmt.Sprintf("fresh-%d", i)))
	}
	started := time.Now()
	deadline := started.Add(inboxWaitDeadline)
	ctx, cancel := context.WithDeadline(e.ctx, deadline)
	defer cancel()
	waiter := e.goBegin(ctx, keys...)
	var r inboxBeginResult
	released := false
	select {
	case r = <-waiter:
	case <-time.After(time.Until(deadline) + inboxWaitSlack):
		e.t.Errorf("%s waiting on a held key: still waiting %s after its ctx deadline (%s); ctx must bound Begin, its wait included", e.mode(), inboxWaitSlack, inboxWaitDeadline)
		if err := holder.rollback(); err != nil { // let it through
			e.t.Error(err)
		}
		released = true
		r = <-waiter
	}
	returned := time.Now()
	elapsed := returned.Sub(started)
	switch {
	case r.err == nil:
		e.t.Errorf("%s waiting on a held key with a %s ctx = %s after %s, want ctx's error", e.mode(), inboxWaitDeadline, r.a.tx.Result(), elapsed)
		r.a.abandon()
	case !errors.Is(r.err, context.DeadlineExceeded):
		e.t.Errorf("%s waiting on a held key past its ctx deadline: %v (after %s), want an error wrapping context.DeadlineExceeded", e.mode(), r.err, elapsed)
	case returned.Before(deadline):
		e.t.Errorf("%s failed after %s, before its ctx deadline (%s)", e.mode(), elapsed, inboxWaitDeadline)
	}
	if !released {
		e.must("", holder.rollback())
	}
	if e.t.Failed() {
		return
	}
	// Nothing of the failed Begin is left: every key is free.
	e.wantFree("the Begin whose ctx ended must leave nothing behind", keys...)
	for _, k := range keys {
		e.wantFree("the Begin whose ctx ended must leave nothing behind", k)
	}
}

// inboxFailingBegins runs calls, each a Begin that must fail with its error
// class, and checks that none wrote anything: in joined mode all inside
// one outer transaction, which must stay usable and, committed, commit
// only the valid attempt made in it afterwards.
func (e *inboxEnv) inboxFailingBegins(ok string, calls []inboxFailingBegin) {
	e.t.Helper()
	var outer OuterTx
	if e.joined {
		outer = e.mustOuter()
	}
	for _, c := range calls {
		ctx := e.ctx
		if c.ctx != nil {
			ctx = c.ctx
		}
		if outer != nil {
			ctx = outer.Context(ctx)
		}
		tx, err := e.fx.Store.Begin(ctx, e.scope, c.keys, c.retention)
		if tx != nil {
			e.open.addInbox(tx)
		}
		mustBe(e.t, fmt.Sprintf("%s %s", e.mode(), c.what), err, c.want)
	}
	if outer != nil {
		a := e.expectIn(outer, stores.Claimed, ok)
		e.must("", a.effect())
		e.must("", a.commit([]byte("ok")))
		e.must("committing the outer transaction after the failed Begins", outer.Commit(e.ctx))
		e.wantEffects(ok, 1, "after the outer commit")
		e.wantDuplicate("ok", ok)
		return
	}
	e.wantFree("a Begin that failed records none of its keys", ok)
}

type inboxFailingBegin struct {
	what      string
	ctx       context.Context // nil: the test's
	keys      []string
	retention time.Duration
	want      error
}

func testInboxInvalidInput(e *inboxEnv) {
	ok := e.key("ok")
	r := e.retention()
	e.inboxFailingBegins(ok, []inboxFailingBegin{
		{what: "with no keys", keys: nil, retention: r, want: stores.ErrInvalidKey},
		{what: "with an empty key list", keys: []string{}, retention: r, want: stores.ErrInvalidKey},
		{what: "with an empty key", keys: []string{ok, ""}, retention: r, want: stores.ErrInvalidKey},
		{what: "with a zero retention", keys: []string{ok}, retention: 0, want: stores.ErrInvalidArgument},
		{what: "with a negative retention", keys: []string{ok}, retention: -time.Second, want: stores.ErrInvalidArgument},
	})
}

func testInboxContextDone(e *inboxEnv) {
	ok := e.key("ok")
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	r := e.retention()
	e.inboxFailingBegins(ok, []inboxFailingBegin{
		{what: "with a cancelled ctx", ctx: cancelled, keys: []string{ok}, retention: r, want: context.Canceled},
		{what: "with a ctx past its deadline", ctx: expired, keys: []string{ok, e.key("other")}, retention: r, want: context.DeadlineExceeded},
	})
	e.wantFree("a Begin whose ctx was done records none of its keys", e.key("other"))
}

func testInboxClosed(e *inboxEnv) {
	k := e.key("a")
	e.must("", e.expect(stores.Claimed, k).commit(nil))
	e.must("Close", e.fx.Store.Close(e.ctx))
	e.must("second Close", e.fx.Store.Close(e.ctx))
	_, err := e.tryBegin(e.ctx, e.scope, e.key("b"))
	mustBe(e.t, e.mode()+" after Close", err, stores.ErrClosed)
	_, err = e.tryBegin(e.ctx, e.scope, k)
	mustBe(e.t, e.mode()+" of a committed key after Close", err, stores.ErrClosed)
}

func testInboxCommitContextDone(e *inboxEnv) {
	// A ctx already done: Commit fails with its error before any I/O
	// and commits nothing.
	for _, data := range [][]byte{nil, []byte("out")} {
		k := e.key(fmt.Sprintf("cancelled-%d", len(data)))
		a := e.expect(stores.Claimed, k)
		e.must("", a.effect())
		ctx, cancel := context.WithCancel(e.ctx)
		cancel()
		err := a.tx.Commit(ctx, data)
		if !errors.Is(err, context.Canceled) {
			e.t.Errorf("Commit(data %q) with a cancelled ctx = %v, want an error wrapping context.Canceled (a call whose ctx is already done fails before any I/O and changes nothing)", data, err)
		}
		_ = a.tx.Rollback(e.ctx) // the caller ends what a failed Commit left
		e.must("", a.endOuter(true))
		if got := e.effects(a.label); err != nil && got != 0 {
			e.t.Errorf("Commit(data %q) with a cancelled ctx failed, yet %d effects are committed", data, got)
		}
		if err != nil {
			e.wantFree("a Commit with a cancelled ctx commits nothing", k)
		}
	}

	// A ctx that ends during Commit: either outcome, but record and
	// effect commit together or not at all, and nil (with, in joined
	// mode, a successful outer commit) means committed.
	// Deadlines from 1µs to 10ms, 1.5 times apart, so that some end
	// during the round trips of any store.
	var deadlines []time.Duration
	for d := time.Microsecond; d <= 10*time.Millisecond; d = d * 3 / 2 {
		deadlines = append(deadlines, d)
	}
	for i, d := range deadlines {
		k := e.key(fmt.Sprintf("deadline-%d", i))
		a := e.expect(stores.Claimed, k)
		e.must("", a.effect())
		ctx, cancel := context.WithTimeout(e.ctx, d)
		err := a.tx.Commit(ctx, []byte("out"))
		ctxErr := ctx.Err()
		cancel()
		if err != nil {
			_ = a.tx.Rollback(e.ctx)
			if ctxErr != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, stores.ErrUnavailable) {
				e.t.Errorf("Commit with a %s ctx failed after its deadline with %v, want an error wrapping context.DeadlineExceeded (or ErrUnavailable)", d, err)
			}
		}
		// In joined mode the outer commit decides. It may fail after a
		// Commit that succeeded (a driver may break the connection when
		// ctx ends just after the statement): that is the owner's
		// failure to handle, and nothing must be committed then.
		var outerErr error
		if a.ownsOuter {
			outerErr = a.outer.Commit(e.ctx)
			a.ownsOuter = false
		}
		failed := err != nil || outerErr != nil
		// The redelivery's Begin first: it waits for a commit still under
		// way (the client gave up on it, the database may not have), so
		// the effects are counted once the outcome is settled.
		b, berr := e.tryBegin(e.ctx, e.scope, k)
		if berr != nil {
			e.t.Fatalf("%s(%q) after a Commit with a %s ctx: %v", e.mode(), k, d, berr)
		}
		effects := e.effects(a.label)
		switch res := b.tx.Result(); {
		case res == stores.Duplicate && effects == 1 && string(b.tx.Data()) == "out":
			e.must("", b.finish())
		case res == stores.Claimed && effects == 0 && failed:
			e.must("", b.rollback())
		default:
			b.abandon()
			e.t.Fatalf("Commit with a %s ctx returned %v (outer commit: %v); then %d effects committed and %s(%q) = %s with Data %q: want a Duplicate with Data %q and 1 effect, or (after an error) Claimed and 0 effects", d, err, outerErr, effects, e.mode(), k, res, b.tx.Data(), "out")
		}
	}
}

func testInboxJoinedHandlerError(e *inboxEnv) {
	k, kb := e.key("a"), e.key("b")
	outer := e.mustOuter()
	e.must("the outer transaction's own write", e.fx.WriteEffect(outer.Context(e.ctx), e.key("outer")))

	// The first attempt's handler fails after its write: Rollback to the
	// savepoint.
	a1 := e.expectIn(outer, stores.Claimed, k)
	e.must("", a1.effect())
	e.must("", a1.rollback())
	// The outer transaction is usable; the record of a1 is gone from it.
	a2 := e.expectIn(outer, stores.Claimed, k)
	e.must("", a2.effect())
	e.must("", a2.commit([]byte("ok")))
	// A third attempt in the same transaction sees the second's record.
	if a3 := e.expectIn(outer, stores.Duplicate, k); string(a3.tx.Data()) != "ok" {
		e.t.Fatalf("a Duplicate in the outer transaction with Data %q, want %q", a3.tx.Data(), "ok")
	}
	b := e.expectIn(outer, stores.Claimed, kb)
	e.must("", b.effect())
	e.must("", b.rollback())
	e.wantEffects(k, 0, "before the outer commit")
	e.must("committing the outer transaction", outer.Commit(e.ctx))

	e.wantEffects(e.key("outer"), 1, "(the outer transaction's own write) after the outer commit")
	e.wantEffects(k, 1, "after one rolled-back and one committed attempt")
	e.wantEffects(kb, 0, "after a rolled-back attempt and the outer commit")
	e.wantDuplicate("ok", k)
	e.wantFree("its only attempt was rolled back to its savepoint", kb)
}

func testInboxJoinedOuterRollback(e *inboxEnv) {
	k := e.key("a")
	outer := e.mustOuter()
	a := e.expectIn(outer, stores.Claimed, k)
	e.must("", a.effect())
	e.must("", a.commit([]byte("gone")))
	e.must("rolling the outer transaction back", outer.Rollback(e.ctx))
	e.wantEffects(k, 0, "after the outer rollback")
	e.wantFree("its outer transaction was rolled back", k)
}

func testInboxJoinedTxAborted(e *inboxEnv) {
	if len(e.fx.AbortOuter) == 0 {
		e.t.Skip("the fixture has no AbortOuter: no way to make the database end an outer transaction")
	}
	for _, ab := range e.fx.AbortOuter {
		e.t.Run(ab.Name, func(t *testing.T) {
			t.Run("Begin", func(t *testing.T) { testInboxBeginInAborted(e.sub(t), ab) })
			t.Run("Commit", func(t *testing.T) { testInboxCommitInAborted(e.sub(t), ab) })
		})
	}
}

// testInboxBeginInAborted: Begin joined to a transaction the database
// ended fails with ErrTxAborted and writes nothing, and nothing is
// committed outside a transaction.
func testInboxBeginInAborted(e *inboxEnv, ab OuterAbort) {
	before, k := e.key(ab.Name+"-before"), e.key(ab.Name+"-after")
	outer := e.mustOuter()
	// A message the transaction handled before the database ended it.
	p := e.expectIn(outer, stores.Claimed, before)
	e.must("", p.effect())
	e.must("", p.commit([]byte("before")))
	e.must("InboxFixture.AbortOuter "+ab.Name, ab.Abort(e.ctx, outer))

	itx, err := e.fx.Store.Begin(outer.Context(e.ctx), e.scope, []string{k}, e.retention())
	if !errors.Is(err, stores.ErrTxAborted) {
		res := "no InboxTx"
		if itx != nil {
			e.open.addInbox(itx)
			res = itx.Result().String()
		}
		e.t.Errorf("joined Begin in a transaction the database ended (%s) = %s, %v; want an error wrapping ErrTxAborted", ab.Name, res, err)
		if err == nil && itx != nil && itx.Result() == stores.Claimed {
			// What a middleware does next: run the handler, commit.
			herr := e.fx.WriteEffect(itx.Context(outer.Context(e.ctx)), k)
			cerr := itx.Commit(e.ctx, []byte("after"))
			e.t.Logf("then the handler's write: %v; Commit: %v", herr, cerr)
		}
	}
	_ = outer.Rollback(e.ctx) // its owner ends the transaction
	if n := e.effects(k); n != 0 {
		e.t.Errorf("%d effects %q committed outside any transaction", n, k)
	}
	if n := e.effects(before); n != 0 {
		e.t.Errorf("%d effects %q committed: AbortOuter %s did not end the transaction", n, before, ab.Name)
	}
	e.checkFreeOrReport(k, "joined Begin in an ended transaction wrote its record outside any transaction")
	e.checkFreeOrReport(before, "AbortOuter "+ab.Name+" did not end the transaction")
}

// testInboxCommitInAborted: Commit of an attempt whose outer transaction
// the database ended fails with ErrTxAborted, and nothing is committed.
func testInboxCommitInAborted(e *inboxEnv, ab OuterAbort) {
	k := e.key(ab.Name + "-commit")
	outer := e.mustOuter()
	a := e.expectIn(outer, stores.Claimed, k)
	e.must("", a.effect())
	e.must("InboxFixture.AbortOuter "+ab.Name, ab.Abort(e.ctx, outer))
	err := a.tx.Commit(e.ctx, []byte("out"))
	if !errors.Is(err, stores.ErrTxAborted) {
		e.t.Errorf("Commit of a joined attempt whose transaction the database ended (%s) = %v, want an error wrapping ErrTxAborted", ab.Name, err)
	}
	_ = a.tx.Rollback(e.ctx)
	_ = outer.Rollback(e.ctx)
	if n := e.effects(k); n != 0 {
		e.t.Errorf("%d effects %q committed outside any transaction", n, k)
	}
	e.checkFreeOrReport(k, "Commit in an ended transaction committed the record outside any transaction")
}

// checkFreeOrReport is wantFree that reports with Errorf, for a test that
// goes on to gather the whole picture.
func (e *inboxEnv) checkFreeOrReport(k, why string) {
	e.t.Helper()
	a, err := e.tryBegin(e.ctx, e.scope, k)
	if err != nil {
		e.t.Errorf("%s(%q): %v", e.mode(), k, err)
		return
	}
	if res := a.tx.Result(); res != stores.Claimed {
		e.t.Errorf("%s(%q) = %s with Data %q, want claimed: %s", e.mode(), k, res, a.tx.Data(), why)
		a.abandon()
		return
	}
	if err := a.rollback(); err != nil {
		e.t.Error(err)
	}
}
