package sqlstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The group commit on SQLite: sqlstore's batch tests (TestBatch*) run on
// PostgreSQL and MySQL inside the sqlstore package, whose tests must not
// import a SQLite driver; these run them on SQLite, holding and failing
// batches through sqliteHooks instead of the package's batch hook. A
// batch of several calls is one transaction of their statements
// (execInTx); a lone call runs its own statements outside one.

// sqliteGate holds the first write a store prepares (a lone claim, the
// plug) until open, so that the calls made meanwhile queue behind it in
// the batcher (MaxInFlight 1) and form the next batch; with holdSecond it
// then holds the first write of the next transaction (that batch) until
// open2; with fail it refuses that write, failing the batch's
// transaction once.
type sqliteGate struct {
	t     *testing.T
	s     *sqlstore.Store
	hooks *sqliteHooks

	held, open   chan struct{}
	held2, open2 chan struct{}
	holdSecond   bool
	fail         bool
	failed       atomic.Bool
	writes       atomic.Int64
}

// newSQLiteBatchStore returns a batching store (MaxInFlight 1) on a
// SQLite database of its own, and its gate, not armed yet.
func newSQLiteBatchStore(t *testing.T, clock stores.Clock) (*sqlstore.Store, *sqliteGate) {
	h := &sqliteHooks{}
	db, _ := sqliteWithHooks(t, h)
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{MaxInFlight: 1}})
	h.table.Store(s.Table())
	g := &sqliteGate{t: t, s: s, hooks: h, held: make(chan struct{}), open: make(chan struct{}), held2: make(chan struct{}), open2: make(chan struct{})}
	return s, g
}

// arm makes the gate hold the next write.
func (g *sqliteGate) arm() {
	var seenFirst atomic.Bool
	f := func(inTx bool, before int) int {
		g.writes.Add(1)
		if seenFirst.CompareAndSwap(false, true) {
			close(g.held)
			<-g.open
			return sqlite3.SQLITE_OK
		}
		if !inTx || before != 0 {
			return sqlite3.SQLITE_OK
		}
		// The first write of a transaction: a batch of several calls.
		if g.holdSecond && !g.failed.Load() {
			select {
			case <-g.held2:
			default:
				close(g.held2)
				<-g.open2
			}
		}
		if g.fail && g.failed.CompareAndSwap(false, true) {
			return sqlite3.SQLITE_DENY
		}
		return sqlite3.SQLITE_OK
	}
	g.hooks.onWrite.Store(&f)
	g.t.Cleanup(func() { g.hooks.onWrite.Store(nil) })
}

// plug starts a lone claim that the gate holds, and returns once it is
// held; wait for it with the returned function after open.
func (g *sqliteGate) plug(ctx context.Context, scope string) (wait func()) {
	g.arm()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := g.s.Claim(ctx, scope, []string{"plug-" + storetest.NewID()}, time.Minute); err != nil {
			g.t.Errorf("plug claim: %v", err)
		}
	}()
	<-g.held
	return func() { <-done }
}

// queued waits until n calls besides the plug wait in the batcher's
// queue, however long a loaded machine takes to get them there.
func (g *sqliteGate) queued(n int) {
	testkit.WaitFor(g.t, time.Minute, fmt.Sprintf("%d calls waiting in the batcher", n), func() bool {
		return testkit.WaitingInBatcher() >= n
	})
}

// batchedTogether fails t unless the writes of at least min calls
// committed in one transaction.
func (g *sqliteGate) batchedTogether(min int) {
	g.t.Helper()
	txs := g.hooks.transactions()
	for _, n := range txs {
		if n >= min {
			return
		}
	}
	g.t.Fatalf("writes of each transaction %v: want one of %d calls at least", txs, min)
}

// TestSQLiteBatchSharesStatements: on SQLite, calls made while a batch
// runs queue and then commit together, in one transaction, each with its
// own result; their Completes too.
func TestSQLiteBatchSharesStatements(t *testing.T) {
	s, g := newSQLiteBatchStore(t, nil)
	ctx := context.Background()
	wait := g.plug(ctx, "share")
	const n = 12
	claims := make([]*stores.Claim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { claims[i], errs[i] = s.Claim(ctx, "share", []string{fmt.Sprint("k", i)}, time.Minute) })
	}
	g.queued(n)
	close(g.open)
	wg.Wait()
	wait()
	for i := range n {
		if errs[i] != nil || claims[i].Result != stores.Claimed {
			t.Fatalf("claim %d: %+v %v", i, claims[i], errs[i])
		}
	}
	g.batchedTogether(2)
	for i := range n {
		wg.Go(func() { errs[i] = s.Complete(ctx, claims[i], time.Hour, []byte{byte(i), 0, 0xff}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("complete %d: %v", i, errs[i])
		}
		c, err := s.Claim(ctx, "share", []string{fmt.Sprint("k", i)}, time.Minute)
		if err != nil || c.Result != stores.Duplicate || !bytes.Equal(c.Data, []byte{byte(i), 0, 0xff}) {
			t.Fatalf("claim %d after complete: %+v %v", i, c, err)
		}
	}
	t.Logf("writes of each transaction: %v", g.hooks.transactions())
}

// runSQLiteMixed runs the calls of sqltest.PrepareMixed (sqlstore's batch tests'
// set: claims of every outcome, Completes, a stale Complete, a Release,
// an Extend) together on a batching SQLite store, its batch failing once
// when fail, and checks each result.
func runSQLiteMixed(t *testing.T, fail bool) *sqliteGate {
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, g := newSQLiteBatchStore(t, clock)
	m := sqltest.PrepareMixed(t, s, clock)
	g.fail = fail
	wait := g.plug(context.Background(), m.Scope)
	m.Run(t, func(calls int) {
		g.queued(calls)
		close(g.open)
	})
	wait()
	return g
}

// TestSQLiteBatchMixedResults: on SQLite, one batch holding claims of
// every outcome (new, duplicate with data, in progress, expired
// takeover, the same key twice) and Completes, a stale Complete, a
// Release and an Extend gives each call its own result.
func TestSQLiteBatchMixedResults(t *testing.T) {
	g := runSQLiteMixed(t, false)
	g.batchedTogether(8)
}

// TestSQLiteBatchStatementFailure: on SQLite, when a batch's transaction
// fails (a statement refused), its calls run on their own and still get
// their own results.
func TestSQLiteBatchStatementFailure(t *testing.T) {
	g := runSQLiteMixed(t, true)
	if !g.failed.Load() {
		t.Fatal("no batch of several calls ran: nothing was refused")
	}
}

// TestSQLiteBatchOrphanedClaimReleased: on SQLite, a caller that gives up
// while its batch runs gets its context's error, and the claim the batch
// made for it is released, so the next delivery is not held up for a
// lease.
func TestSQLiteBatchOrphanedClaimReleased(t *testing.T) {
	s, g := newSQLiteBatchStore(t, nil)
	g.holdSecond = true
	ctx := context.Background()
	wait := g.plug(ctx, "orphan")
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var gaveUp, other error
	var otherClaim *stores.Claim
	left := make(chan struct{})
	wg.Go(func() {
		defer close(left)
		_, gaveUp = s.Claim(cctx, "orphan", []string{"orphan"}, time.Hour)
	})
	wg.Go(func() { otherClaim, other = s.Claim(ctx, "orphan", []string{"other"}, time.Hour) })
	g.queued(2)
	close(g.open)
	<-g.held2 // both run in the second batch, held at its first write
	cancel()
	<-left // the caller left while its batch is held
	close(g.open2)
	wg.Wait()
	wait()
	if !errors.Is(gaveUp, context.Canceled) {
		t.Fatalf("the caller that gave up got %v, want context.Canceled", gaveUp)
	}
	if other != nil || otherClaim.Result != stores.Claimed {
		t.Fatalf("the other caller: %+v %v", otherClaim, other)
	}
	testkit.WaitFor(t, time.Minute, "the orphaned claim released", func() bool {
		c, err := s.Claim(ctx, "orphan", []string{"orphan"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return c.Result == stores.Claimed
	})
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
