package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// Environment variables RunModel reads.
const (
	// seedEnv replays one sequence: STORETEST_SEED=<seed printed by a
	// failure>.
	seedEnv = "STORETEST_SEED"
	// stepsEnv sets the number of steps per store (a soak run).
	stepsEnv = "STORETEST_MODEL_STEPS"
)

// Defaults of RunModel.
const (
	// seqSteps is the length of one sequence: a fresh store, and the seed
	// a failure prints.
	seqSteps = 150
	// defaultSteps bound a default run, as do the budgets below, whichever
	// comes first.
	defaultFakeSteps = 50000
	defaultRealSteps = 6000
	fakeBudget       = 4 * time.Second
	realBudget       = 8 * time.Second
	// shrinkBudget bounds the search for a shorter reproducer.
	shrinkBudgetFake = 20 * time.Second
	shrinkBudgetReal = 20 * time.Second
	maxShrinkRuns    = 400
	// Lanes are how many sequences run at once, each on a store of its
	// own. Real time is mostly spent sleeping.
	fakeLanes = 2
	realLanes = 4
	// callTimeout bounds every call made with a live context.
	callTimeout = 30 * time.Second
	// closeAfter is how many calls a sequence makes after Close.
	closeAfter = 6
)

// modelStart is the fake clock's time when a sequence starts: a whole
// second, so that truncating the clock's offset from it to a precision
// that divides a second truncates the clock itself.
var modelStart = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// RunModel checks a store against a reference model of the state machine
// in the [stores] package doc. It runs random sequences of calls, each
// on a new store from f, and after every call checks the store's answer
// against what the model allows:
//
//   - Claim of one to four keys drawn from a small pool, so that keys
//     collide, repeat within one call and overlap between multi-key
//     claims; now and then with no keys, an empty key, a 1 MiB key, a
//     scope of its own or an overlong one. Its Result, Takeover (required
//     while the lease has been over for at most the lease it was last
//     given, optional after, never for a record that was done) and
//     Duplicate Data (the first done key's, in the caller's key order)
//     are checked, as is that each token is new, that Scope and Keys are
//     the call's, and that a claim is all or nothing.
//   - Complete, Release and Extend of any claim handed out before:
//     current owners, owners whose lease ran out, claims taken over,
//     completed or released, and forged claims (nil, a Result that is
//     not Claimed, a token that is empty, wrong or another claim's, more
//     or fewer keys, another scope). A fenced call must succeed exactly
//     when the claim still owns every key, and otherwise fail with
//     [stores.ErrLostClaim] and change nothing; a forged claim may also
//     be refused with [stores.ErrInvalidArgument], and one that is nil,
//     not Claimed or without a token must be. The store must not change
//     the claim it is given.
//   - Durations of 0, negative, 1ns, 1µs, 1ms, seconds, hours, a century
//     and math.MaxInt64 (refused with [stores.ErrInvalidArgument] past
//     [MaxDuration], capped otherwise); contexts already cancelled or
//     past their deadline (the call must fail with the context's error,
//     or another refusal its arguments call for, and change nothing);
//     data nil, empty, small, binary or 64 KiB.
//   - Groups of concurrent calls on disjoint records (batching stores
//     batch them), moves of the clock, the store's own housekeeping (see
//     [Maintenance]), and Close, which must return nil however often it
//     is called, after which every call must fail with
//     [stores.ErrClosed] whatever its arguments.
//
// A store on the fake clock is checked to the nanosecond; a [RealTime]
// store within an interval of the exact instant (see expiry).
//
// Each sequence has a seed. A failure prints it, the call that broke the
// contract, the shortest sequence of calls found that still does (chunks
// of calls are removed, and concurrent groups taken apart, and the rest
// replayed on a new store each time), and the sequence's whole trace.
// STORETEST_SEED=<seed> replays that one sequence (select the store with
// -run); on a fake clock it is deterministic. Several sequences run at
// once, each on a store of its own. By default a run stops after about
// 4s of sequences on a fake clock and 8s in real time (a quarter of that
// with -short); [ModelSteps] or STORETEST_MODEL_STEPS=n runs exactly n
// steps instead.
//
// Options: [RealTime], [Precision], [MaxKeyLen], [MaxScopeLen],
// [MaxDuration], [MaxElapsed], [Maintenance] and [ModelSteps] describe
// the store. For example, for a store keeping time to the millisecond
// on its server and refusing keys over 512 bytes:
//
//	func TestModel(t *testing.T) {
//		storetest.RunModel(t, func(t *testing.T, _ stores.Clock) stores.Store {
//			s := mystore.New(client, mystore.Config{Prefix: "test-" + storetest.NewID()})
//			t.Cleanup(func() { _ = s.Close(context.Background()) })
//			return s
//		}, storetest.RealTime(200*time.Millisecond), storetest.Precision(time.Millisecond),
//			storetest.MaxKeyLen(512))
//	}
//
// The factory is called on the test's goroutine, once per sequence and
// again for every replay while shrinking a failure; each store it
// returns must start empty (a table or key prefix of its own) and may be
// used while others it returned are. RunModel closes each store at the
// end of its sequence; cleanups the factory registers on t run when the
// test ends.
func RunModel(t *testing.T, f Factory, opts ...Option) {
	t.Helper()
	o := options{unit: 250 * time.Millisecond, precision: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.precision <= 0 || time.Second%o.precision != 0 {
		t.Fatalf("storetest.RunModel: Precision(%s) must be positive and divide one second", o.precision)
	}
	if o.maxKeyLen < 0 || o.maxScopeLen < 0 || o.maxDuration < 0 || o.maxElapsed < 0 || o.steps < 0 {
		t.Fatal("storetest.RunModel: negative option")
	}
	cfg := &modelConfig{options: o, factory: f}

	if v := os.Getenv(seedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("storetest.RunModel: %s=%q: %v", seedEnv, v, err)
		}
		t.Logf("replaying the sequence of %s=%d", seedEnv, seed)
		s, clock := cfg.newStore(t)
		res := cfg.runSequence(s, clock, seed, seqSteps, nil, nil)
		if res.fail != nil {
			cfg.report(t, seed, res)
		}
		return
	}

	steps, budget := o.steps, time.Duration(0)
	if v := os.Getenv(stepsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("storetest.RunModel: %s=%q: want a positive number of steps", stepsEnv, v)
		}
		steps = n
	}
	if steps == 0 {
		steps, budget = defaultFakeSteps, fakeBudget
		if o.realTime {
			steps, budget = defaultRealSteps, realBudget
		}
		if testing.Short() {
			budget /= 4
		}
	}

	cfg.run(t, steps, budget)
}

// finished is a sequence run by a lane.
type finished struct {
	seed uint64
	res  seqResult
}

// run runs sequences of seqSteps steps, several at a time (each on a
// store of its own), until steps have run or, when budget is not zero,
// the budget of time is spent, and reports the first to fail.
func (c *modelConfig) run(t *testing.T, steps int, budget time.Duration) {
	t.Helper()
	lanes := fakeLanes
	if c.realTime {
		lanes = realLanes
	}
	var (
		start      = time.Now()
		results    = make(chan finished)
		stop       atomic.Bool
		running    int
		dispatched int
		done, seqs int
		failed     *finished
	)
	// However the test ends (t.Fatal in the factory included), no lane
	// outlives it.
	defer func() {
		stop.Store(true)
		for ; running > 0; running-- {
			<-results
		}
	}()
	for {
		for running < lanes && failed == nil && dispatched < steps && !t.Failed() &&
			(budget == 0 || seqs == 0 || time.Since(start) < budget) {
			seed := randomSeed()
			n := min(seqSteps, steps-dispatched)
			s, clock := c.newStore(t)
			dispatched += n
			seqs++
			running++
			go func() {
				results <- finished{seed, c.runSequence(s, clock, seed, n, nil, &stop)}
			}()
		}
		if running == 0 {
			break
		}
		f := <-results
		running--
		done += f.res.steps
		if f.res.fail != nil && failed == nil {
			failed = &f
			stop.Store(true)
		}
	}
	if failed != nil {
		c.report(t, failed.seed, failed.res)
		return
	}
	t.Logf("%d steps in %d sequences of up to %d, %d at a time, in %s", done, seqs, seqSteps, lanes, time.Since(start).Round(time.Millisecond))
}

func randomSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	// Keep it short enough to type.
	return binary.LittleEndian.Uint64(b[:]) % 1e12
}

// modelConfig is one RunModel call.
type modelConfig struct {
	options
	factory Factory
}

// ---------------------------------------------------------------------
// Operations

type opKind uint8

const (
	opClaim opKind = iota
	opComplete
	opRelease
	opExtend
	opAdvance
	opClose
	opMaintain
	opGroup
)

type ctxKind uint8

const (
	ctxLive ctxKind = iota
	ctxCanceled
	ctxExpired
)

// forgeKind says how a fenced call's claim is made from a handle.
type forgeKind uint8

const (
	forgeNone      forgeKind = iota // the claim Claim returned
	forgeNil                        // nil
	forgeResult                     // a copy with another Result
	forgeNoToken                    // a copy with an empty token
	forgeBadToken                   // a copy with a token no claim got
	forgeSwapToken                  // a copy with another claim's token
	forgeAddKey                     // a copy with one more key
	forgeDropKey                    // a copy with one key less
	forgeScope                      // a copy in another scope
	forgeNoKeys                     // a copy with no keys
	forgeEmptyKey                   // a copy with an empty key added
	numForges
)

type dataKind uint8

const (
	dataNil dataKind = iota
	dataEmpty
	dataSmall
	dataBinary
	dataBig
	numDataKinds
)

// modelOp is one step of a sequence. Handles (claims returned by Claim)
// are named by the id of the op that made them, so a shortened sequence
// still means the same thing; an op whose handle's Claim was removed is
// skipped.
type modelOp struct {
	id     int
	kind   opKind
	ctx    ctxKind
	scope  int   // Claim
	keys   []int // Claim; indexes into the key pool
	nilKey bool  // Claim with a nil keys slice
	d      time.Duration
	data   dataKind
	target int // fenced: handle id
	forge  forgeKind
	other  int       // forge argument: a handle id, a key or scope index, a variant
	group  []modelOp // opGroup: concurrent calls on disjoint records
}

// ---------------------------------------------------------------------
// The model

// recKey names a record: indexes into the scope and key pools.
type recKey struct{ scope, key int }

// record is what the model knows of a store's record. Its expiry (done)
// or lease end (processing) is an instant in [lo, hi], as offsets from
// the sequence's start; a fake clock with nanosecond precision knows it
// exactly (lo == hi).
type record struct {
	done   bool
	token  string
	lo, hi time.Duration
	lease  time.Duration // processing: the lease it was last given
	data   []byte        // done
	setBy  int           // id of the op that wrote it
}

// status is what a record can be at the moment a call looks at it.
type status uint8

const (
	stFree status = iota // none, expired done, or forgotten
	stDone               // done, live
	stLive               // processing under a valid lease
	stKept               // processing, lease over, still kept
	numStatus
)

var statusNames = [...]string{"free", "done", "leased", "expired-lease"}

type statusSet uint8

func (s statusSet) has(st status) bool { return s&(1<<st) != 0 }

func (s statusSet) String() string {
	var parts []string
	for st := range numStatus {
		if s.has(st) {
			parts = append(parts, statusNames[st])
		}
	}
	return strings.Join(parts, "|")
}

func saturatingAdd(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

func ceilTo(d, p time.Duration) time.Duration {
	if p <= 1 {
		return d
	}
	r := d % p
	if r == 0 {
		return d
	}
	return saturatingAdd(d, p-r)
}

func truncTo(d, p time.Duration) time.Duration {
	if p <= 1 {
		return d
	}
	return d - d%p
}

// slack is the allowance of a real-time store for the rate of its
// server's clock against the test's, and rounding in the server.
func (c *modelConfig) slack(d time.Duration) time.Duration {
	if !c.realTime {
		return 0
	}
	return 2*time.Millisecond + min(d, time.Hour)/1000
}

// expiry returns the interval of the instant now+d as the store computes
// it for a call that ran between cs and ce: its clock truncated to its
// precision plus d rounded up to it, or its exact time plus d with the
// sum rounded up (either is the contract's "rounded up, never down").
//
// On the fake clock the model knows the exact time, and a third of the
// clock's moves land exactly on, or one nanosecond before, an instant
// where a record changes (a lease or retention running out, a lease
// having been over for exactly its length): nothing earlier, nothing
// later is accepted. A RealTime store keeps time on its server; the
// suite sleeps to move time (up to 3/4 of the unit at a time) and uses
// leases and retentions of half a unit to two units besides the edge
// values. The model keeps, for every record, the interval in which its
// expiry must lie (from the call's start and end times, the precision
// and the slack), accepts either answer when a call falls inside that
// interval, and narrows the interval from the answer. It needs no
// cooperation from the scheduler, only a server clock that runs at the
// rate of the test's.
func (c *modelConfig) expiry(cs, ce, d time.Duration) (lo, hi time.Duration) {
	p := c.precision
	cd := ceilTo(d, p)
	if c.realTime {
		s := c.slack(d)
		return saturatingAdd(cs, cd) - p - s, saturatingAdd(saturatingAdd(ce, cd), p+s)
	}
	return saturatingAdd(truncTo(cs, p), cd), ceilTo(saturatingAdd(ce, d), p)
}

// possible returns what r can be for a call running between cs and ce.
func possible(r *record, cs, ce time.Duration) statusSet {
	if r == nil {
		return 1 << stFree
	}
	var s statusSet
	if r.done {
		if cs < r.hi {
			s |= 1 << stDone
		}
		if ce >= r.lo {
			s |= 1 << stFree
		}
		return s
	}
	if cs < r.hi {
		s |= 1 << stLive
	}
	if ce >= r.lo {
		s |= 1 << stKept
	}
	// The store may forget it once its lease has been over for longer
	// than the lease it was last given.
	if ce > saturatingAdd(r.lo, r.lease) {
		s |= 1 << stFree
	}
	return s
}

// model is the reference state of one sequence.
type model struct {
	recs map[recKey]*record
	// dead holds, for a token whose fenced call failed with ErrLostClaim
	// while the model could not tell which key was lost, the keys that
	// may have been: a call of that token over all of them must fail.
	dead map[string][]recKey
}

// ---------------------------------------------------------------------
// A sequence

type handle struct {
	c     *stores.Claim // as Claim returned it
	snap  stores.Claim  // a copy, to see the store never changes it
	scope int
	keys  []int
}

type traceLine struct {
	id   int
	at   time.Duration
	text string
	fail bool
}

type seqResult struct {
	ops   []modelOp // the ops run, the failing one last
	trace []traceLine
	steps int
	fail  *violation
	pools string // what the scope names stand for
}

type violation struct {
	opID int
	kind opKind
	msg  string
}

// pools are the scopes and keys of one sequence.
type pools struct {
	scopes     []string
	scopeNames []string
	keys       []string
	keyNames   []string
	nRegular   int // keys[:nRegular] are the everyday keys
	kEmpty     int
	kHuge      int
	kOver      int // -1 without MaxKeyLen
	kExact     int // -1 without MaxKeyLen
}

const (
	scopeMain = iota
	scopeColon
	scopeLong
	scopeOdd
	numScopes
)

func (c *modelConfig) newPools() *pools {
	base := "model-" + NewID()
	p := &pools{}
	long := 4096
	if c.maxScopeLen > 0 {
		long = c.maxScopeLen + 1
	}
	odd := base + "/\x00{}%"
	if c.maxScopeLen > len(base) {
		odd = base + strings.Repeat("s", c.maxScopeLen-len(base)) // exactly the bound
	}
	p.scopes = []string{base, base + ":a", base + strings.Repeat("L", max(long-len(base), 1)), odd}
	p.scopeNames = []string{"S0", "S1", "S2", "S3"}

	// A scope and key pair a naive "scope:key" join would merge with
	// another: (S1, "b") and (S0, "a:b").
	p.keys = []string{"a", "b", "a:b", "{c}", "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c", "x\x00%:=#\xff"}
	p.nRegular = len(p.keys)
	p.kEmpty = len(p.keys)
	p.keys = append(p.keys, "")
	p.kHuge = len(p.keys)
	p.keys = append(p.keys, strings.Repeat("k", 1<<20))
	p.kOver, p.kExact = -1, -1
	if c.maxKeyLen > 0 {
		p.kOver = len(p.keys)
		p.keys = append(p.keys, strings.Repeat("o", c.maxKeyLen+1))
		p.kExact = len(p.keys)
		p.keys = append(p.keys, strings.Repeat("e", c.maxKeyLen))
	}
	for i, k := range p.keys {
		switch {
		case i == p.kHuge:
			p.keyNames = append(p.keyNames, "<1 MiB key>")
		case i == p.kOver || i == p.kExact:
			p.keyNames = append(p.keyNames, fmt.Sprintf("<%d-byte key>", len(k)))
		default:
			p.keyNames = append(p.keyNames, strconv.Quote(k))
		}
	}
	return p
}

func (p *pools) describe() string {
	base := p.scopes[scopeMain]
	suffix := func(i int) string {
		if s := p.scopes[i][len(base):]; len(s) <= 16 {
			return fmt.Sprintf("S0+%q", s)
		}
		return fmt.Sprintf("<%d-byte scope>", len(p.scopes[i]))
	}
	return fmt.Sprintf("S0=%q, S1=%s, S2=%s, S3=%s", base, suffix(scopeColon), suffix(scopeLong), suffix(scopeOdd))
}

type seq struct {
	cfg *modelConfig
	p   *pools
	s   stores.Store
	rng *mrand.Rand

	clock   *FakeClock
	start   time.Time
	elapsed time.Duration // fake: how far the clock moved

	m       model
	handles map[int]*handle
	claimed []int // ids of handles with a Claimed result, in order
	all     []int // ids of every handle
	tokens  map[string]int

	closed     bool
	closeAt    int
	afterClose int
	nextID     int
	trace      []traceLine
	ran        []modelOp
	replay     bool
	failure    *violation
}

// newStore makes the store of one sequence, and its fake clock. It runs
// on the test's goroutine: the factory may call t.Fatal.
func (c *modelConfig) newStore(t *testing.T) (stores.Store, *FakeClock) {
	t.Helper()
	var clock *FakeClock
	var sc stores.Clock = stores.SystemClock{}
	if !c.realTime {
		clock = NewFakeClock(modelStart)
		sc = clock
	}
	s := c.factory(t, sc)
	if s == nil {
		t.Fatal("storetest.RunModel: the factory returned a nil store")
	}
	return s, clock
}

// replay runs ops on a new store.
func (c *modelConfig) replay(t *testing.T, seed uint64, ops []modelOp) seqResult {
	t.Helper()
	s, clock := c.newStore(t)
	return c.runSequence(s, clock, seed, 0, ops, nil)
}

// runSequence runs one sequence on s, a new store from newStore: n steps
// generated from seed, or the given ops (a replay) when ops is not nil.
// It stops early when stop is set.
func (c *modelConfig) runSequence(s stores.Store, clock *FakeClock, seed uint64, n int, ops []modelOp, stop *atomic.Bool) seqResult {
	sq := &seq{
		cfg:     c,
		p:       c.newPools(),
		s:       s,
		clock:   clock,
		rng:     mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		m:       model{recs: map[recKey]*record{}, dead: map[string][]recKey{}},
		handles: map[int]*handle{},
		tokens:  map[string]int{},
		closeAt: -1,
		replay:  ops != nil,
	}
	if c.realTime {
		sq.start = time.Now()
	} else {
		sq.start = modelStart
	}
	if ops == nil && sq.rng.IntN(3) == 0 {
		// From the full length, not n: a shorter last sequence of a run
		// is then a prefix of the one its seed replays.
		sq.closeAt = seqSteps - 1 - sq.rng.IntN(closeAfter)
	}

	steps := 0
	if ops != nil {
		for _, op := range ops {
			if sq.failure != nil {
				break
			}
			if sq.exec(op) {
				steps++
			}
		}
	} else {
		for step := 0; step < n && sq.failure == nil && (stop == nil || !stop.Load()); step++ {
			if sq.closed {
				if sq.afterClose >= closeAfter {
					break
				}
				sq.afterClose++
			}
			op := sq.gen(step)
			sq.exec(op)
			steps++
		}
	}
	if !sq.closed {
		// Close it here, not in a cleanup, so that a store that cannot
		// close is reported with its trace.
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := sq.s.Close(ctx)
		cancel()
		if err != nil && sq.failure == nil {
			sq.fail(-1, opClose, fmt.Sprintf("Close at the end of the sequence: %v", err))
		}
	}
	return seqResult{ops: sq.ran, trace: sq.trace, steps: steps, fail: sq.failure, pools: sq.p.describe()}
}

func (sq *seq) now() time.Duration {
	if sq.cfg.realTime {
		return time.Since(sq.start)
	}
	return sq.clock.Now().Sub(sq.start)
}

func (sq *seq) fail(id int, kind opKind, msg string) {
	if sq.failure == nil {
		sq.failure = &violation{opID: id, kind: kind, msg: msg}
	}
}

func (sq *seq) newID() int {
	sq.nextID++
	return sq.nextID
}

// ---------------------------------------------------------------------
// Generation

func (sq *seq) gen(step int) modelOp {
	r := sq.rng
	if step == sq.closeAt && !sq.closed {
		return modelOp{id: sq.newID(), kind: opClose}
	}
	x := r.IntN(100)
	switch {
	case x < 34:
		return sq.genClaim()
	case x < 48:
		return sq.genFenced(opComplete)
	case x < 55:
		return sq.genFenced(opRelease)
	case x < 63:
		return sq.genFenced(opExtend)
	case x < 80:
		if sq.closed {
			return sq.genClaim()
		}
		return sq.genAdvance()
	case x < 87:
		return sq.genGroup()
	case x < 90 && sq.cfg.maintenance != nil && !sq.closed:
		return modelOp{id: sq.newID(), kind: opMaintain}
	case x < 91 && sq.closed:
		return modelOp{id: sq.newID(), kind: opClose}
	default:
		return sq.genClaim()
	}
}

func (sq *seq) genCtx() ctxKind {
	switch x := sq.rng.IntN(100); {
	case x < 3:
		return ctxCanceled
	case x < 6:
		return ctxExpired
	}
	return ctxLive
}

func (sq *seq) genKey() int {
	r, p := sq.rng, sq.p
	switch x := r.IntN(1000); {
	case x < 15:
		return p.kEmpty
	case x < 30:
		return p.kHuge
	case x < 45 && p.kOver >= 0:
		return p.kOver
	case x < 60 && p.kExact >= 0:
		return p.kExact
	}
	// A small pool, skewed so that a few keys see most calls.
	return min(r.IntN(p.nRegular), r.IntN(p.nRegular))
}

func (sq *seq) genScope() int {
	switch x := sq.rng.IntN(100); {
	case x < 12:
		return scopeColon
	case x < 15:
		return scopeLong
	case x < 18:
		return scopeOdd
	}
	return scopeMain
}

func (sq *seq) genClaim() modelOp {
	r := sq.rng
	op := modelOp{id: sq.newID(), kind: opClaim, ctx: sq.genCtx(), scope: sq.genScope(), d: sq.genDuration()}
	switch x := r.IntN(100); {
	case x < 2:
		op.nilKey = true
		return op
	case x < 3:
		op.keys = []int{}
		return op
	}
	n := 1
	switch x := r.IntN(100); {
	case x < 25:
		n = 2
	case x < 38:
		n = 3
	case x < 46:
		n = 4
	}
	for range n {
		op.keys = append(op.keys, sq.genKey())
	}
	return op
}

// genDuration returns a lease or retention.
func (sq *seq) genDuration() time.Duration {

	r, c := sq.rng, sq.cfg
	p := c.precision
	switch x := r.IntN(100); {
	case x < 4:
		return []time.Duration{0, -1, -time.Hour, math.MinInt64}[r.IntN(4)]
	case x < 8:
		return []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 100 * 365 * 24 * time.Hour}[r.IntN(3)]
	case x < 10 && c.maxDuration > 0:
		return c.maxDuration + time.Duration(r.IntN(2))
	case x < 26:
		return []time.Duration{1, 999, time.Microsecond, 1001, time.Millisecond, time.Millisecond + 1,
			max(p-1, 1), p, p + 1}[r.IntN(9)]
	case x < 36:
		return []time.Duration{time.Second, 7 * time.Second, 30 * time.Second, time.Hour, 5 * time.Hour}[r.IntN(5)]
	}
	if c.realTime {
		return c.unit/2 + time.Duration(r.Int64N(int64(c.unit*3/2)))
	}
	if r.IntN(3) == 0 {
		return time.Duration(1 + r.Int64N(int64(20*time.Millisecond)))
	}
	return time.Duration(1 + r.Int64N(int64(3*time.Second)))
}

func (sq *seq) genAdvance() modelOp {
	r, c := sq.rng, sq.cfg
	var d time.Duration
	if c.realTime {
		switch x := r.IntN(100); {
		case x < 15:
			d = 0
		case x < 30:
			d = time.Duration(r.Int64N(int64(5 * time.Millisecond)))
		default:
			d = time.Duration(r.Int64N(int64(c.unit * 3 / 4)))
		}
		return modelOp{id: sq.newID(), kind: opAdvance, d: d}
	}
	if x := r.IntN(100); x < 30 {
		if d, ok := sq.boundary(); ok {
			return modelOp{id: sq.newID(), kind: opAdvance, d: d}
		}
	}
	switch x := r.IntN(100); {
	case x < 8:
		d = 0
	case x < 20:
		d = []time.Duration{1, 999, time.Microsecond, time.Millisecond, time.Millisecond - 1}[r.IntN(5)]
	case x < 40:
		d = time.Duration(r.Int64N(int64(20 * time.Millisecond)))
	case x < 80:
		d = time.Duration(r.Int64N(int64(2 * time.Second)))
	case x < 90:
		d = []time.Duration{30 * time.Second, time.Minute}[r.IntN(2)]
	default:
		d = []time.Duration{time.Hour, 3 * time.Hour}[r.IntN(2)]
	}
	if c.maxElapsed > 0 && sq.elapsed+d > c.maxElapsed {
		d = time.Duration(r.Int64N(int64(c.maxElapsed-sq.elapsed) + 1))
	}
	return modelOp{id: sq.newID(), kind: opAdvance, d: d}
}

// boundary returns an advance of the fake clock to an instant where a
// record changes, or one nanosecond before: a lease or retention running
// out, or a lease having been over for exactly the lease it was given,
// after which the store may forget it.
func (sq *seq) boundary() (time.Duration, bool) {
	now := sq.now()
	var targets []time.Duration
	for _, r := range sq.m.recs {
		targets = append(targets, r.lo-1, r.lo, r.hi-1, r.hi)
		if !r.done {
			f := saturatingAdd(r.lo, r.lease)
			targets = append(targets, f, saturatingAdd(f, 1))
		}
	}
	slices.Sort(targets) // map order is random: keep the seed's meaning
	targets = slices.DeleteFunc(targets, func(x time.Duration) bool {
		return x <= now || x-now > 100*24*time.Hour ||
			(sq.cfg.maxElapsed > 0 && sq.elapsed+(x-now) > sq.cfg.maxElapsed)
	})
	if len(targets) == 0 {
		return 0, false
	}
	return targets[sq.rng.IntN(len(targets))] - now, true
}

// pickHandle returns the id of a handle to use, or 0 when there is none.
func (sq *seq) pickHandle() int {
	r := sq.rng
	if len(sq.claimed) > 0 && r.IntN(100) < 85 {
		if r.IntN(2) == 0 {
			n := min(3, len(sq.claimed))
			return sq.claimed[len(sq.claimed)-1-r.IntN(n)]
		}
		return sq.claimed[r.IntN(len(sq.claimed))]
	}
	if len(sq.all) > 0 {
		return sq.all[r.IntN(len(sq.all))]
	}
	return 0
}

func (sq *seq) genFenced(kind opKind) modelOp {
	r := sq.rng
	op := modelOp{id: sq.newID(), kind: kind, ctx: sq.genCtx(), target: sq.pickHandle()}
	switch kind {
	case opComplete:
		op.d = sq.genDuration()
		op.data = dataKind(r.IntN(int(numDataKinds)))
		if op.data == dataBig && r.IntN(2) == 0 {
			op.data = dataSmall // 64 KiB now and then only
		}
	case opExtend:
		op.d = sq.genDuration()
	}
	if op.target == 0 {
		op.forge = forgeNil
		return op
	}
	if r.IntN(100) < 15 {
		op.forge = forgeKind(1 + r.IntN(int(numForges)-1))
		switch op.forge {
		case forgeSwapToken:
			op.other = sq.pickHandle()
		case forgeAddKey:
			op.other = sq.genKey()
		case forgeScope:
			op.other = 1 + r.IntN(numScopes-1)
		default:
			op.other = r.IntN(3)
		}
	}
	return op
}

func (sq *seq) genGroup() modelOp {
	r := sq.rng
	op := modelOp{id: sq.newID(), kind: opGroup}
	n := 2 + r.IntN(3)
	var used []recKey
	for tries := 0; len(op.group) < n && tries < 4*n; tries++ {
		var sub modelOp
		switch x := r.IntN(100); {
		case x < 45:
			sub = sq.genClaim()
		case x < 70:
			sub = sq.genFenced(opComplete)
		case x < 80:
			sub = sq.genFenced(opRelease)
		default:
			sub = sq.genFenced(opExtend)
		}
		ks := sq.opRecords(sub)
		if overlaps(ks, used) {
			continue
		}
		used = append(used, ks...)
		op.group = append(op.group, sub)
	}
	return op
}

// opRecords returns the records op may touch (as far as the generator
// can tell; a swapped token does not matter: the keys do).
func (sq *seq) opRecords(op modelOp) []recKey {
	switch op.kind {
	case opClaim:
		out := make([]recKey, 0, len(op.keys))
		for _, k := range op.keys {
			out = append(out, recKey{op.scope, k})
		}
		return out
	case opComplete, opRelease, opExtend:
		h := sq.handles[op.target]
		if h == nil {
			return nil
		}
		out := make([]recKey, 0, len(h.keys)+1)
		sc := h.scope
		if op.forge == forgeScope {
			sc = op.other
		}
		for _, k := range h.keys {
			out = append(out, recKey{sc, k})
		}
		if op.forge == forgeAddKey {
			out = append(out, recKey{sc, op.other})
		}
		return out
	}
	return nil
}

func overlaps(a, b []recKey) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------
// Execution

// call is one store call made, with what it returned.
type call struct {
	op      modelOp
	cs, ce  time.Duration // when it started and ended
	err     error
	claim   *stores.Claim // Claim's result
	ctxErr  error         // the error of the context it was given, if done
	arg     *stores.Claim // fenced: the claim passed
	argSc   int
	argKeys []int
	genuine bool
	skip    bool // its handle is not there (a shortened replay)
	keys    []string
	data    []byte
}

func makeCtx(k ctxKind) (context.Context, context.CancelFunc) {
	switch k {
	case ctxCanceled:
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	case ctxExpired:
		return context.WithDeadline(context.Background(), time.Unix(1, 0))
	}
	return context.WithTimeout(context.Background(), callTimeout)
}

// exec runs op and checks it. It reports false when the op was skipped.
func (sq *seq) exec(op modelOp) bool {
	switch op.kind {
	case opAdvance:
		if sq.cfg.realTime {
			time.Sleep(op.d)
		} else {
			sq.clock.Advance(op.d)
			sq.elapsed += op.d
		}
		sq.ran = append(sq.ran, op)
		sq.line(op.id, sq.now(), fmt.Sprintf("advance %s", fmtDur(op.d)))
		return true
	case opClose:
		at := sq.now()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := sq.s.Close(ctx)
		cancel()
		sq.closed = true
		sq.ran = append(sq.ran, op)
		sq.line(op.id, at, fmt.Sprintf("Close() -> %v", errText(err)))
		if err != nil {
			sq.fail(op.id, op.kind, fmt.Sprintf("Close returned %v, want nil", err))
		}
		return true
	case opMaintain:
		if sq.closed {
			return false
		}
		at := sq.now()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := sq.cfg.maintenance(ctx, sq.s)
		cancel()
		sq.ran = append(sq.ran, op)
		sq.line(op.id, at, fmt.Sprintf("maintenance -> %v", errText(err)))
		if err != nil {
			sq.fail(op.id, op.kind, fmt.Sprintf("maintenance failed: %v", err))
		}
		return true
	case opGroup:
		calls := make([]*call, len(op.group))
		for i, sub := range op.group {
			calls[i] = sq.prepare(sub)
		}
		var wg sync.WaitGroup
		for _, c := range calls {
			if c.skip {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sq.do(c)
			}()
		}
		wg.Wait()
		ran := modelOp{id: op.id, kind: opGroup}
		for _, c := range calls {
			if !c.skip {
				ran.group = append(ran.group, c.op)
			}
		}
		if len(ran.group) == 0 {
			return false
		}
		sq.ran = append(sq.ran, ran)
		sq.line(op.id, sq.now(), fmt.Sprintf("concurrently (%d calls on disjoint records):", len(ran.group)))
		for _, c := range calls {
			if !c.skip {
				sq.check(c, "  ")
			}
		}
		return true
	}
	c := sq.prepare(op)
	if c.skip {
		return false
	}
	sq.do(c)
	sq.ran = append(sq.ran, op)
	sq.check(c, "")
	return true
}

// prepare builds the arguments of a store call.
func (sq *seq) prepare(op modelOp) *call {
	c := &call{op: op}
	switch op.kind {
	case opClaim:
		if !op.nilKey {
			c.keys = make([]string, len(op.keys))
			for i, k := range op.keys {
				c.keys[i] = sq.p.keys[k]
			}
		}
	case opComplete, opRelease, opExtend:
		c.skip = !sq.buildArg(c)
		if op.kind == opComplete {
			c.data = makeData(op.data, op.id)
		}
	}
	return c
}

func makeData(k dataKind, id int) []byte {
	switch k {
	case dataNil:
		return nil
	case dataEmpty:
		return []byte{}
	case dataSmall:
		return []byte("data-" + strconv.Itoa(id))
	case dataBinary:
		return binary.BigEndian.AppendUint32([]byte{0, 0xff, '"', '\\', '\n', 0x80}, uint32(id))
	default:
		b := make([]byte, 64<<10)
		for i := range b {
			b[i] = byte(i*7 + id)
		}
		binary.BigEndian.PutUint32(b, uint32(id))
		return b
	}
}

// buildArg makes the claim a fenced call passes. It reports false when
// the handle it needs is not there.
func (sq *seq) buildArg(c *call) bool {
	op := c.op
	if op.forge == forgeNil {
		return true
	}
	h := sq.handles[op.target]
	if h == nil {
		return false
	}
	c.argSc, c.argKeys = h.scope, h.keys
	if op.forge == forgeNone {
		c.arg, c.genuine = h.c, true
		return true
	}
	cp := h.snap
	cp.Keys = slices.Clone(h.snap.Keys)
	keys := slices.Clone(h.keys)
	switch op.forge {
	case forgeResult:
		cp.Result = []stores.Result{stores.Duplicate, stores.InProgress, 0}[op.other%3]
		if h.snap.Result != stores.Claimed {
			cp.Result = stores.Claimed // a forged Claimed with no token, or a stale one
		}
	case forgeNoToken:
		cp.Token = ""
	case forgeBadToken:
		switch op.other % 3 {
		case 0:
			cp.Token += "0"
		case 1:
			cp.Token = "not-a-token"
		default:
			if n := len(cp.Token); n > 0 {
				b := []byte(cp.Token)
				b[n-1] ^= 1
				cp.Token = string(b)
			} else {
				cp.Token = "1"
			}
		}
	case forgeSwapToken:
		o := sq.handles[op.other]
		if o == nil {
			return false
		}
		cp.Token = o.snap.Token
	case forgeAddKey:
		cp.Keys = append(cp.Keys, sq.p.keys[op.other])
		keys = append(keys, op.other)
	case forgeDropKey:
		if len(cp.Keys) > 0 {
			i := op.other % len(cp.Keys)
			cp.Keys = slices.Delete(cp.Keys, i, i+1)
			keys = slices.Delete(keys, i, i+1)
		}
	case forgeScope:
		cp.Scope = sq.p.scopes[op.other]
		c.argSc = op.other
	case forgeNoKeys:
		cp.Keys, keys = nil, nil
	case forgeEmptyKey:
		cp.Keys = append(cp.Keys, "")
		keys = append(keys, sq.p.kEmpty)
	}
	c.arg, c.argKeys = &cp, keys
	return true
}

// do makes the store call.
func (sq *seq) do(c *call) {
	ctx, cancel := makeCtx(c.op.ctx)
	defer cancel()
	c.ctxErr = ctx.Err()
	op := c.op
	c.cs = sq.now()
	switch op.kind {
	case opClaim:
		c.claim, c.err = sq.s.Claim(ctx, sq.p.scopes[op.scope], c.keys, op.d)
	case opComplete:
		c.err = sq.s.Complete(ctx, c.arg, op.d, c.data)
	case opRelease:
		c.err = sq.s.Release(ctx, c.arg)
	case opExtend:
		c.err = sq.s.Extend(ctx, c.arg, op.d)
	}
	c.ce = sq.now()
}

// ---------------------------------------------------------------------
// Checking

// expectation is what a call may return when it is refused.
type expectation struct {
	errs []error // the classes it may fail with
	why  []string
}

func (e *expectation) add(err error, why string) {
	if !slices.Contains(e.errs, err) {
		e.errs = append(e.errs, err)
	}
	if !slices.Contains(e.why, why) {
		e.why = append(e.why, why)
	}
}

func (e *expectation) matches(err error) bool {
	for _, want := range e.errs {
		if errors.Is(err, want) {
			return true
		}
	}
	return false
}

func (e *expectation) String() string {
	names := make([]string, len(e.errs))
	for i, err := range e.errs {
		names[i] = errName(err)
	}
	return fmt.Sprintf("an error wrapping %s (%s)", strings.Join(names, " or "), strings.Join(e.why, "; "))
}

func errName(err error) string {
	switch err {
	case stores.ErrClosed:
		return "ErrClosed"
	case stores.ErrLostClaim:
		return "ErrLostClaim"
	case stores.ErrInvalidKey:
		return "ErrInvalidKey"
	case stores.ErrInvalidArgument:
		return "ErrInvalidArgument"
	case context.Canceled:
		return "context.Canceled"
	case context.DeadlineExceeded:
		return "context.DeadlineExceeded"
	}
	return err.Error()
}

func (sq *seq) badDuration(d time.Duration) bool {
	return d <= 0 || (sq.cfg.maxDuration > 0 && d > sq.cfg.maxDuration)
}

// check compares the answer of c with the model, and updates the model.
func (sq *seq) check(c *call, indent string) {
	desc := sq.describeCall(c)
	var got string
	var msg string
	switch c.op.kind {
	case opClaim:
		got, msg = sq.checkClaim(c)
	default:
		got, msg = sq.checkFenced(c)
	}
	if msg != "" {
		sq.line(c.op.id, c.cs, indent+desc+" -> "+got+"    <-- "+msg)
		sq.trace[len(sq.trace)-1].fail = true
		sq.fail(c.op.id, c.op.kind, fmt.Sprintf("%s at %s: got %s; %s", desc, fmtAt(c.cs), got, msg))
		return
	}
	sq.line(c.op.id, c.cs, indent+desc+" -> "+got)
}

// refusal returns what a call must fail with when the store is closed,
// its context is done or its arguments are bad, or nil.
func (sq *seq) refusal(c *call) *expectation {
	var e expectation
	if sq.closed {
		e.add(stores.ErrClosed, "the store is closed")
		return &e
	}
	op := c.op
	switch op.kind {
	case opClaim:
		if len(c.keys) == 0 {
			e.add(stores.ErrInvalidKey, "no keys")
		}
		for _, k := range op.keys {
			switch {
			case k == sq.p.kEmpty:
				e.add(stores.ErrInvalidKey, "an empty key")
			case sq.cfg.maxKeyLen > 0 && len(sq.p.keys[k]) > sq.cfg.maxKeyLen:
				e.add(stores.ErrInvalidKey, "a key longer than MaxKeyLen")
			}
		}
		if sq.cfg.maxScopeLen > 0 && len(sq.p.scopes[op.scope]) > sq.cfg.maxScopeLen {
			e.add(stores.ErrInvalidArgument, "a scope longer than MaxScopeLen")
		}
		if sq.badDuration(op.d) {
			e.add(stores.ErrInvalidArgument, "lease "+fmtDur(op.d))
		}
	default:
		if invalidClaim(c.arg) {
			e.add(stores.ErrInvalidArgument, "not a Claimed claim")
		} else if !c.genuine && c.ctxErr != nil {
			e.add(stores.ErrInvalidArgument, "a forged claim")
		}
		if op.kind != opRelease && sq.badDuration(op.d) {
			e.add(stores.ErrInvalidArgument, "duration "+fmtDur(op.d))
		}
	}
	if c.ctxErr != nil {
		e.add(c.ctxErr, "the context is done")
	}
	if len(e.errs) == 0 {
		return nil
	}
	return &e
}

// invalidClaim reports a claim that is plainly not a Claimed result: a
// store must refuse it with ErrInvalidArgument. (A claim with no keys or
// an empty key is not one either; a store may refuse it so, or find that
// it owns nothing: ErrLostClaim.)
func invalidClaim(c *stores.Claim) bool {
	return c == nil || c.Result != stores.Claimed || c.Token == ""
}

func (sq *seq) checkClaim(c *call) (got, msg string) {
	got = claimText(c.claim, c.err)
	if e := sq.refusal(c); e != nil {
		if c.err == nil || !e.matches(c.err) {
			return got, "want " + e.String()
		}
		return got, ""
	}
	if c.err != nil {
		return got, "want no error"
	}
	cl := c.claim
	if cl == nil {
		return got, "Claim returned a nil claim and no error"
	}
	op := c.op
	if cl.Scope != sq.p.scopes[op.scope] || !slices.Equal(cl.Keys, c.keys) {
		return got, "the claim's Scope and Keys are not the call's"
	}
	switch cl.Result {
	case stores.Claimed:
		if cl.Token == "" {
			return got, "a Claimed result with an empty token"
		}
		if id, seen := sq.tokens[cl.Token]; seen {
			return got, fmt.Sprintf("token %q was already handed out by #%d", cl.Token, id)
		}
		if len(cl.Data) != 0 {
			return got, "a Claimed result with Data"
		}
	case stores.Duplicate, stores.InProgress:
		if cl.Token != "" {
			return got, "a token on a result that is not Claimed"
		}
		if cl.Takeover {
			return got, "Takeover on a result that is not Claimed"
		}
		if cl.Result == stores.InProgress && len(cl.Data) != 0 {
			return got, "Data on an InProgress result"
		}
	default:
		return got, fmt.Sprintf("Result %d is none of Claimed, Duplicate, InProgress", cl.Result)
	}

	// The records, once each, in the caller's order.
	var rks []recKey
	for _, k := range op.keys {
		rk := recKey{op.scope, k}
		if !slices.Contains(rks, rk) {
			rks = append(rks, rk)
		}
	}
	sets := make([]statusSet, len(rks))
	for i, rk := range rks {
		sets[i] = possible(sq.m.recs[rk], c.cs, c.ce)
	}
	narrowed := make([]statusSet, len(rks))
	outcomes := map[string]bool{}
	assign := make([]status, len(rks))
	var walk func(i int)
	walk = func(i int) {
		if i < len(rks) {
			for st := range numStatus {
				if sets[i].has(st) {
					assign[i] = st
					walk(i + 1)
				}
			}
			return
		}
		res, takeover, from := stores.Claimed, false, -1
		for j, st := range assign {
			if st == stDone {
				res, from = stores.Duplicate, j
				break
			}
		}
		if res != stores.Duplicate {
			for _, st := range assign {
				switch st {
				case stLive:
					res = stores.InProgress
				case stKept:
					takeover = true
				}
			}
		}
		var want []byte
		text := res.String()
		switch res {
		case stores.Duplicate:
			want = sq.m.recs[rks[from]].data
			text += " with the data of " + sq.recName(rks[from])
		case stores.Claimed:
			text += fmt.Sprintf(" takeover=%t", takeover)
		}
		outcomes[text] = true
		if res != cl.Result || (res == stores.Claimed && takeover != cl.Takeover) ||
			(res == stores.Duplicate && !bytes.Equal(want, cl.Data)) {
			return
		}
		for j, st := range assign {
			narrowed[j] |= 1 << st
		}
	}
	walk(0)
	if slices.Index(narrowed, 0) >= 0 {
		var states []string
		for i, rk := range rks {
			states = append(states, fmt.Sprintf("%s %s", sq.recName(rk), sets[i]))
		}
		return got, fmt.Sprintf("want %s (the model has %s)", strings.Join(sortedKeys(outcomes), " or "), strings.Join(states, ", "))
	}

	// What the answer tells of the records.
	slack := sq.cfg.slack(0)
	for i, rk := range rks {
		r := sq.m.recs[rk]
		if r == nil || narrowed[i] == sets[i] {
			continue
		}
		n := narrowed[i]
		switch {
		case n == 1<<stFree:
			delete(sq.m.recs, rk)
		case n == 1<<stDone || n == 1<<stLive:
			r.lo = max(r.lo, c.cs+1-slack)
		case !n.has(stDone) && !n.has(stLive):
			r.hi = min(r.hi, c.ce+slack)
		}
	}
	sq.addHandle(op, cl)
	if cl.Result == stores.Claimed {
		sq.tokens[cl.Token] = op.id
		lo, hi := sq.cfg.expiry(c.cs, c.ce, op.d)
		for _, rk := range rks {
			sq.m.recs[rk] = &record{token: cl.Token, lo: lo, hi: hi, lease: op.d, setBy: op.id}
		}
	}
	return got, ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (sq *seq) addHandle(op modelOp, cl *stores.Claim) {
	snap := *cl
	snap.Keys = slices.Clone(cl.Keys)
	snap.Data = slices.Clone(cl.Data)
	sq.handles[op.id] = &handle{c: cl, snap: snap, scope: op.scope, keys: slices.Clone(op.keys)}
	sq.all = append(sq.all, op.id)
	if cl.Result == stores.Claimed {
		sq.claimed = append(sq.claimed, op.id)
	}
}

func (sq *seq) checkFenced(c *call) (got, msg string) {
	got = errText(c.err)
	defer func() {
		// The store must not change the claim it was handed.
		if h := sq.handles[c.op.target]; h != nil && msg == "" {
			if m := sameClaim(h.c, &h.snap); m != "" {
				msg = "the store changed the claim it was given: " + m
			}
		}
	}()
	if e := sq.refusal(c); e != nil {
		if c.err == nil || !e.matches(c.err) {
			return got, "want " + e.String()
		}
		return got, ""
	}

	var rks []recKey
	for _, k := range c.argKeys {
		rk := recKey{c.argSc, k}
		if !slices.Contains(rks, rk) {
			rks = append(rks, rk)
		}
	}
	token := c.arg.Token
	allOwned := true // every record may be owned by token
	var lostBy []recKey
	var why []string
	for _, rk := range rks {
		r := sq.m.recs[rk]
		switch {
		case r == nil:
			allOwned = false
			why = append(why, sq.recName(rk)+" has no record")
		case r.done:
			allOwned = false
			why = append(why, sq.recName(rk)+" is done")
		case r.token != token:
			allOwned = false
			why = append(why, fmt.Sprintf("%s is held by #%d", sq.recName(rk), r.setBy))
		case possible(r, c.cs, c.ce).has(stFree):
			lostBy = append(lostBy, rk) // the store may have forgotten it
		}
	}
	if len(rks) == 0 {
		allOwned = false
		why = append(why, "the claim has no keys")
	}
	if d, ok := sq.m.dead[token]; ok && allOwned && containsAll(rks, d) {
		allOwned = false
		why = append(why, "an earlier call of this token found one of these records gone")
	}
	okAllowed := allOwned
	lostAllowed := !allOwned || len(lostBy) > 0
	var e expectation
	if lostAllowed {
		e.add(stores.ErrLostClaim, "the claim does not own every record")
	}
	if !c.genuine {
		e.add(stores.ErrLostClaim, "a forged claim")
		e.add(stores.ErrInvalidArgument, "a forged claim")
	}

	if c.err != nil {
		if !e.matches(c.err) {
			if len(e.errs) == 0 {
				return got, "want success: the claim owns every record"
			}
			return got, "want " + e.String()
		}
		if c.genuine && allOwned && errors.Is(c.err, stores.ErrLostClaim) {
			// Learnt: a record the model was unsure of is gone.
			if len(lostBy) == 1 {
				delete(sq.m.recs, lostBy[0])
			} else {
				sq.m.dead[token] = lostBy
			}
		}
		return got, ""
	}
	if !okAllowed {
		return got, fmt.Sprintf("want %s: %s", e.String(), strings.Join(why, ", "))
	}
	op := c.op
	switch op.kind {
	case opComplete:
		lo, hi := sq.cfg.expiry(c.cs, c.ce, op.d)
		for _, rk := range rks {
			sq.m.recs[rk] = &record{done: true, lo: lo, hi: hi, data: slices.Clone(c.data), setBy: op.id}
		}
	case opRelease:
		for _, rk := range rks {
			delete(sq.m.recs, rk)
		}
	case opExtend:
		lo, hi := sq.cfg.expiry(c.cs, c.ce, op.d)
		for _, rk := range rks {
			r := sq.m.recs[rk]
			r.lo, r.hi, r.lease = lo, hi, op.d
		}
	}
	return got, ""
}

func containsAll(set, sub []recKey) bool {
	for _, x := range sub {
		if !slices.Contains(set, x) {
			return false
		}
	}
	return true
}

func sameClaim(c, snap *stores.Claim) string {
	switch {
	case c.Scope != snap.Scope || !slices.Equal(c.Keys, snap.Keys):
		return "Scope or Keys"
	case c.Result != snap.Result:
		return "Result"
	case c.Token != snap.Token:
		return "Token"
	case c.Takeover != snap.Takeover:
		return "Takeover"
	case !bytes.Equal(c.Data, snap.Data):
		return "Data"
	}
	return ""
}

// ---------------------------------------------------------------------
// Trace and report

func (sq *seq) line(id int, at time.Duration, text string) {
	sq.trace = append(sq.trace, traceLine{id: id, at: at, text: text})
}

func (sq *seq) recName(rk recKey) string {
	return "(" + sq.p.scopeNames[rk.scope] + ", " + sq.p.keyNames[rk.key] + ")"
}

func (sq *seq) describeCall(c *call) string {
	op := c.op
	ctx := ""
	switch op.ctx {
	case ctxCanceled:
		ctx = "cancelled ctx, "
	case ctxExpired:
		ctx = "expired ctx, "
	}
	switch op.kind {
	case opClaim:
		keys := "nil"
		if !op.nilKey {
			names := make([]string, len(op.keys))
			for i, k := range op.keys {
				names[i] = sq.p.keyNames[k]
			}
			keys = "[" + strings.Join(names, " ") + "]"
		}
		return fmt.Sprintf("c%d := Claim(%s%s, %s, %s)", op.id, ctx, sq.p.scopeNames[op.scope], keys, fmtDur(op.d))
	case opComplete:
		return fmt.Sprintf("Complete(%s%s, %s, %s)", ctx, sq.describeArg(op), fmtDur(op.d), fmtData(op.data, c.data))
	case opRelease:
		return fmt.Sprintf("Release(%s%s)", ctx, sq.describeArg(op))
	default:
		return fmt.Sprintf("Extend(%s%s, %s)", ctx, sq.describeArg(op), fmtDur(op.d))
	}
}

func (sq *seq) describeArg(op modelOp) string {
	h := fmt.Sprintf("c%d", op.target)
	switch op.forge {
	case forgeNone:
		return h
	case forgeNil:
		return "nil"
	case forgeResult:
		return fmt.Sprintf("%s with Result %s", h, []string{"duplicate", "in_progress", "0"}[op.other%3])
	case forgeNoToken:
		return h + " with no Token"
	case forgeBadToken:
		return h + " with a bad Token"
	case forgeSwapToken:
		return fmt.Sprintf("%s with the Token of c%d", h, op.other)
	case forgeAddKey:
		return fmt.Sprintf("%s plus key %s", h, sq.p.keyNames[op.other])
	case forgeDropKey:
		return fmt.Sprintf("%s less its key %d", h, op.other)
	case forgeScope:
		return fmt.Sprintf("%s in scope %s", h, sq.p.scopeNames[op.other])
	case forgeNoKeys:
		return h + " with no Keys"
	default:
		return h + " plus an empty key"
	}
}

func fmtData(k dataKind, b []byte) string {
	switch k {
	case dataNil:
		return "nil"
	case dataEmpty:
		return "[]byte{}"
	case dataBig:
		return "<64 KiB>"
	}
	return fmt.Sprintf("%q", b)
}

func fmtDur(d time.Duration) string {
	switch d {
	case math.MaxInt64:
		return "math.MaxInt64"
	case math.MaxInt64 - 1:
		return "math.MaxInt64-1"
	case math.MinInt64:
		return "math.MinInt64"
	}
	return d.String()
}

func fmtAt(d time.Duration) string { return "t=+" + d.String() }

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	// Stores quote keys and scopes in errors: a 1 MiB key makes a long one.
	const max = 300
	text := err.Error()
	if len(text) > max {
		text = fmt.Sprintf("%s…(%d bytes)", text[:max], len(text))
	}
	return "error: " + text
}

func claimText(c *stores.Claim, err error) string {
	if err != nil {
		return errText(err)
	}
	if c == nil {
		return "<nil>"
	}
	s := c.Result.String()
	switch c.Result {
	case stores.Claimed:
		s += fmt.Sprintf(" takeover=%t", c.Takeover)
	case stores.Duplicate:
		switch n := len(c.Data); {
		case n > 64:
			s += fmt.Sprintf(" data=<%d bytes>", n)
		default:
			s += fmt.Sprintf(" data=%q", c.Data)
		}
	}
	return s
}

func formatTrace(lines []traceLine) string {
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "  #%-4d %-16s %s\n", l.id, fmtAt(l.at), l.text)
	}
	return b.String()
}

// report fails t with the violation of res, after looking for a shorter
// sequence that still shows one.
func (c *modelConfig) report(t *testing.T, seed uint64, res seqResult) {
	t.Helper()
	short := c.shrink(t, seed, res)
	var b strings.Builder
	fmt.Fprintf(&b, "storetest.RunModel: the store breaks the contract, in the sequence of seed %d (replay it with %s=%d):\n", seed, seedEnv, seed)
	fmt.Fprintf(&b, "  %s\n", res.fail.msg)
	fmt.Fprintf(&b, "Scopes: %s. Times are the clock's offset from the sequence's start", res.pools)
	if c.realTime {
		b.WriteString(" (real time: the reproducer is timing-dependent)")
	}
	b.WriteString(".\n")
	if short.fail != nil && len(short.ops) < len(res.ops) {
		fmt.Fprintf(&b, "\nShortest sequence found that breaks it (%d of %d steps, on a new store):\n  %s\n%s",
			len(short.ops), len(res.ops), short.fail.msg, formatTrace(short.trace))
	}
	fmt.Fprintf(&b, "\nTrace of the sequence up to the failure (%d steps):\n%s", len(res.ops), formatTrace(res.trace))
	t.Fatal(b.String())
}

// shrink replays ever shorter subsequences of res's ops on new stores,
// keeping each that still fails at an op of the same kind, and returns
// the shortest: it removes chunks of ops, halving their size down to one
// op, and takes concurrent groups apart, until neither helps.
func (c *modelConfig) shrink(t *testing.T, seed uint64, res seqResult) seqResult {
	budget := shrinkBudgetFake
	if c.realTime {
		budget = shrinkBudgetReal
	}
	deadline := time.Now().Add(budget)
	best := res
	runs := 0
	more := func() bool { return runs < maxShrinkRuns && time.Now().Before(deadline) && !t.Failed() }
	try := func(ops []modelOp) bool {
		runs++
		r := c.replay(t, seed, ops)
		if r.fail == nil || r.fail.kind != res.fail.kind {
			return false
		}
		best = r
		return true
	}
	// removeChunks is ddmin without complements: it never removes the
	// failing op, the last.
	removeChunks := func() bool {
		progress := false
		n := 2
		for len(best.ops) >= 2 && more() {
			ops := best.ops
			chunk := (len(ops) - 1 + n - 1) / n
			removed := false
			for start := 0; start < len(ops)-1 && more(); start += chunk {
				end := min(start+chunk, len(ops)-1)
				if try(append(slices.Clone(ops[:start]), ops[end:]...)) {
					removed = true
					break
				}
			}
			switch {
			case removed:
				progress = true
				n = max(n-1, 2)
			case chunk <= 1:
				return progress
			default:
				n = min(2*n, len(ops)-1)
			}
		}
		return progress
	}
	// splitGroups removes one call of a concurrent group, or makes a
	// group of one a plain call.
	splitGroups := func() bool {
		progress := false
	again:
		for i, op := range best.ops {
			if op.kind != opGroup {
				continue
			}
			for j := range op.group {
				if !more() {
					return progress
				}
				repl := op.group[0]
				if len(op.group) > 1 {
					repl = op
					repl.group = slices.Delete(slices.Clone(op.group), j, j+1)
				}
				cand := slices.Clone(best.ops)
				cand[i] = repl
				if try(cand) {
					progress = true
					goto again
				}
			}
		}
		return progress
	}
	for more() {
		a := removeChunks()
		b := splitGroups()
		if !a && !b {
			break
		}
	}
	return best
}
