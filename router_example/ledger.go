package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	kit "github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// award is one application of the loyalty side effect.
type award struct {
	EventID     string
	PaymentID   string
	CustomerID  string
	Points      int64
	MessageUUID string
}

// ledger is the loyalty service's own state: an entry per award and a
// balance per customer. Adding to a balance is not idempotent, which is the
// point: only the dedup middleware stands between a redelivery and a
// doubled balance.
type ledger interface {
	// Award adds a's points to the customer's balance and records the
	// entry, atomically. Inside a transactional-inbox handler it writes in
	// the inbox transaction (sqlstore.TxFromContext), so effect and dedup
	// record commit or roll back together.
	Award(ctx context.Context, a award) error
	Snapshot(ctx context.Context) (ledgerSnapshot, error)
}

// ledgerSnapshot is what the ledger holds at the end of a run.
type ledgerSnapshot struct {
	Entries      int64            // awards applied
	EntryPoints  int64            // sum of the awards' points
	BalanceTotal int64            // sum of the customers' balances
	PerPayment   map[string]int64 // payment id -> times awarded
}

// kitLedger is the ledger on the module's test kit: kit.Mem for
// the memory and Redis stores (the effect lives in the process, like a
// call to another service would), kit.SQL in the SQL store's
// database otherwise.
type kitLedger struct{ l kit.Ledger }

func newMemLedger() kitLedger { return kitLedger{kit.NewMem()} }

// newSQLLedger creates the ledger's tables; dropping them goes to removers.
func newSQLLedger(ctx context.Context, db *sql.DB, dialect sqlstore.Dialect, runID string, removers *teardown) (kitLedger, error) {
	l, err := kit.NewSQL(db, kit.SQLConfig{Dialect: dialect, Table: ledgerTable(runID)})
	if err != nil {
		return kitLedger{}, err
	}
	if err := l.CreateTables(ctx); err != nil {
		return kitLedger{}, err
	}
	removers.add("drop tables "+strings.Join(l.Tables(), ", "), l.DropTables)
	return kitLedger{l}, nil
}

func ledgerTable(runID string) string { return "loyalty_ledger_" + runID }

// refuseUsedLedger fails with a *runIDUsedError when db holds a ledger of
// runID with entries: an earlier run's awards (a run with -dedup=false
// leaves no dedup record) would count as this run's. It creates nothing;
// a table that cannot be read is taken for none (the ledger's creation
// reports a database that fails).
func refuseUsedLedger(ctx context.Context, db *sql.DB, runID, addr string) error {
	var n int64
	// The name is ours: a fixed prefix and a checked run id.
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ledgerTable(runID)).Scan(&n)
	if err != nil || n == 0 { // no table (or none readable), no entry: no earlier run
		return nil
	}
	return &runIDUsedError{RunID: runID, What: fmt.Sprintf("the ledger table %s of %s holds its %d awards", ledgerTable(runID), addr, n)}
}

func (k kitLedger) Award(ctx context.Context, a award) error {
	return k.l.Record(ctx, kit.Effect{
		Event: a.EventID, Key: a.PaymentID,
		Account: a.CustomerID, Amount: a.Points,
		Message: a.MessageUUID,
	})
}

func (k kitLedger) Snapshot(ctx context.Context) (ledgerSnapshot, error) {
	t, err := k.l.Totals(ctx)
	return ledgerSnapshot{Entries: t.Effects, EntryPoints: t.Amount, BalanceTotal: t.Balance, PerPayment: t.PerKey}, err
}
