package sqlstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The group commit on SQLite: sqlstore's batch tests (TestBatch*) run on
// PostgreSQL and MySQL inside the sqlstore package, whose tests must not
// import a SQLite driver; these run the same scenarios (sqltest's) on
// SQLite, holding and failing batches through sqliteHooks instead of the
// package's batch hook. A batch of several calls is one transaction of
// their statements (execInTx); a lone call runs its own statements
// outside one. The gate is entered at the first write a store prepares
// (the plug's) and at the first write of each transaction (a batch of
// several calls).

// sqliteGate is a sqltest.Gate on SQLite; with fail it refuses the first
// write of the first batch of several calls, failing that batch's
// transaction once.
type sqliteGate struct {
	*sqltest.Gate
	hooks  *sqliteHooks
	fail   bool
	failed atomic.Bool
}

// newSQLiteBatchStore returns a batching store (MaxInFlight 1) on a
// SQLite database of its own, and its gate.
func newSQLiteBatchStore(t *testing.T, clock stores.Clock, fail bool) (*sqlstore.Store, *sqliteGate) {
	h := &sqliteHooks{}
	db, _ := sqliteWithHooks(t, h)
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{MaxInFlight: 1}})
	h.table.Store(s.Table())
	g := &sqliteGate{Gate: sqltest.NewGate(t, s), hooks: h, fail: fail}
	return s, g
}

// arm makes the gate watch the writes prepared from now on: the store's
// setup (sqltest.PrepareMixed's) goes before. With fail, the third write
// of the first batch of several is refused: its transaction fails after
// it has written.
func (g *sqliteGate) arm(t *testing.T) {
	var first atomic.Bool
	f := func(_ int, inTx bool, before int) int {
		switch {
		case first.CompareAndSwap(false, true):
			g.Enter(false)
		case inTx && before == 0:
			g.Enter(true)
		case inTx && before == 2 && g.fail && g.failed.CompareAndSwap(false, true):
			return sqlite3.SQLITE_DENY
		}
		return sqlite3.SQLITE_OK
	}
	g.hooks.onWrite.Store(&f)
	t.Cleanup(func() { g.hooks.onWrite.Store(nil) })
}

// together fails t unless at least min claims committed in one
// transaction.
func (g *sqliteGate) together(t *testing.T) func(min int) {
	return func(min int) {
		t.Helper()
		txs := g.hooks.claimsPerTransaction()
		for _, n := range txs {
			if n >= min {
				return
			}
		}
		t.Fatalf("claims of each transaction %v: want %d in one at least", txs, min)
	}
}

// TestSQLiteBatchSharesStatements: on SQLite, calls made while a batch
// runs queue and then commit together, in one transaction, each with its
// own result; then their Completes.
func TestSQLiteBatchSharesStatements(t *testing.T) {
	s, g := newSQLiteBatchStore(t, nil, false)
	g.arm(t)
	sqltest.RunBatchSharesStatements(t, s, g.Gate, g.together(t))
	t.Logf("claims of each transaction: %v", g.hooks.claimsPerTransaction())
}

// runSQLiteMixed runs sqltest.RunBatchMixed (claims of every outcome,
// Completes, a stale Complete, a Release, an Extend in one batch) on a
// batching SQLite store, its batch failing once when fail.
func runSQLiteMixed(t *testing.T, fail bool) *sqliteGate {
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, g := newSQLiteBatchStore(t, clock, fail)
	m := sqltest.PrepareMixed(t, s, clock)
	g.arm(t)
	sqltest.RunBatchMixed(t, m, g.Gate)
	return g
}

// TestSQLiteBatchMixedResults: on SQLite, one batch holding claims of
// every outcome (new, duplicate with data, in progress, expired
// takeover, the same key twice) and Completes, a stale Complete, a
// Release and an Extend gives each call its own result.
func TestSQLiteBatchMixedResults(t *testing.T) {
	g := runSQLiteMixed(t, false)
	// Its 8 claims, less the second of the same key (it runs on its own
	// after the batch), in one transaction.
	g.together(t)(7)
}

// TestSQLiteBatchStatementFailure: on SQLite, when a batch's transaction
// fails after it has written (its third write refused), it is rolled
// back, and its calls run on their own and still get their own results.
func TestSQLiteBatchStatementFailure(t *testing.T) {
	if g := runSQLiteMixed(t, true); !g.failed.Load() {
		t.Fatal("no batch of several calls ran: nothing was refused")
	}
}

// TestSQLiteBatchOrphanedClaimReleased: on SQLite, a caller that gives up
// while its batch runs gets its context's error, and the claim the batch
// made for it is released.
func TestSQLiteBatchOrphanedClaimReleased(t *testing.T) {
	s, g := newSQLiteBatchStore(t, nil, false)
	g.arm(t)
	sqltest.RunBatchOrphanedClaimReleased(t, s, g.Gate)
}
