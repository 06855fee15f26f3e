package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

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

// ledgerSnapshot is what the ledger holds at the end of a run.
type ledgerSnapshot struct {
	Entries      int64            // awards applied
	EntryPoints  int64            // sum of the awards' points
	BalanceTotal int64            // sum of the customers' balances
	PerPayment   map[string]int64 // payment id -> times awarded
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

// memLedger is the ledger of the memory and Redis store runs: the effect
// lives in the process, like a call to another service would.
type memLedger struct {
	mu         sync.Mutex
	entries    []award
	balances   map[string]int64
	perPayment map[string]int64
}

func newMemLedger() *memLedger {
	return &memLedger{balances: map[string]int64{}, perPayment: map[string]int64{}}
}

func (l *memLedger) Award(_ context.Context, a award) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, a)
	l.balances[a.CustomerID] += a.Points
	l.perPayment[a.PaymentID]++
	return nil
}

func (l *memLedger) Snapshot(context.Context) (ledgerSnapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ledgerSnapshot{Entries: int64(len(l.entries)), PerPayment: make(map[string]int64, len(l.perPayment))}
	for _, e := range l.entries {
		s.EntryPoints += e.Points
	}
	for _, b := range l.balances {
		s.BalanceTotal += b
	}
	for k, v := range l.perPayment {
		s.PerPayment[k] = v
	}
	return s, nil
}

// sqlLedger keeps the ledger in the dedup store's database.
type sqlLedger struct {
	db      *sql.DB
	dialect sqlstore.Dialect
	entries string // table names
	balance string
}

func ledgerTables(runID string) (entries, balance string) {
	return "loyalty_ledger_" + runID, "loyalty_balance_" + runID
}

// newSQLLedger creates the ledger's tables; dropping them goes to removers.
func newSQLLedger(ctx context.Context, db *sql.DB, dialect sqlstore.Dialect, runID string, removers *teardown) (*sqlLedger, error) {
	l := &sqlLedger{db: db, dialect: dialect}
	l.entries, l.balance = ledgerTables(runID)
	for _, stmt := range l.schema() {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("create the ledger tables: %w", err)
		}
	}
	removers.add("drop tables "+l.entries+", "+l.balance, func(ctx context.Context) error {
		var errs []error
		for _, t := range []string{l.entries, l.balance} {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	return l, nil
}

func (l *sqlLedger) schema() []string {
	switch l.dialect {
	case sqlstore.Postgres:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + l.entries + ` (
    id           BIGSERIAL PRIMARY KEY,
    payment_id   TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    customer_id  TEXT NOT NULL,
    points       BIGINT NOT NULL,
    message_uuid TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + l.balance + ` (
    customer_id TEXT PRIMARY KEY,
    points      BIGINT NOT NULL)`,
		}
	case sqlstore.MySQL:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + l.entries + ` (
    id           BIGINT AUTO_INCREMENT PRIMARY KEY,
    payment_id   VARCHAR(64) NOT NULL,
    event_id     VARCHAR(64) NOT NULL,
    customer_id  VARCHAR(64) NOT NULL,
    points       BIGINT NOT NULL,
    message_uuid VARCHAR(64) NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + l.balance + ` (
    customer_id VARCHAR(64) PRIMARY KEY,
    points      BIGINT NOT NULL)`,
		}
	default:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + l.entries + ` (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id   TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    customer_id  TEXT NOT NULL,
    points       INTEGER NOT NULL,
    message_uuid TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + l.balance + ` (
    customer_id TEXT PRIMARY KEY,
    points      INTEGER NOT NULL)`,
		}
	}
}

// bind rewrites ? placeholders as $1, $2... for PostgreSQL.
func (l *sqlLedger) bind(q string) string {
	if l.dialect != sqlstore.Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (l *sqlLedger) upsertBalance() string {
	if l.dialect == sqlstore.MySQL {
		return "INSERT INTO " + l.balance + " (customer_id, points) VALUES (?, ?) ON DUPLICATE KEY UPDATE points = points + VALUES(points)"
	}
	return l.bind("INSERT INTO " + l.balance + " (customer_id, points) VALUES (?, ?) ON CONFLICT (customer_id) DO UPDATE SET points = " + l.balance + ".points + excluded.points")
}

func (l *sqlLedger) Award(ctx context.Context, a award) error {
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		// Transactional inbox: the middleware commits.
		return l.write(ctx, tx, a)
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := l.write(ctx, tx, a); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (l *sqlLedger) write(ctx context.Context, tx *sql.Tx, a award) error {
	if _, err := tx.ExecContext(ctx, l.bind("INSERT INTO "+l.entries+" (payment_id, event_id, customer_id, points, message_uuid) VALUES (?, ?, ?, ?, ?)"),
		a.PaymentID, a.EventID, a.CustomerID, a.Points, a.MessageUUID); err != nil {
		return fmt.Errorf("ledger entry: %w", err)
	}
	if _, err := tx.ExecContext(ctx, l.upsertBalance(), a.CustomerID, a.Points); err != nil {
		return fmt.Errorf("ledger balance: %w", err)
	}
	return nil
}

func (l *sqlLedger) Snapshot(ctx context.Context) (ledgerSnapshot, error) {
	s := ledgerSnapshot{PerPayment: map[string]int64{}}
	rows, err := l.db.QueryContext(ctx, "SELECT payment_id, COUNT(*), SUM(points) FROM "+l.entries+" GROUP BY payment_id")
	if err != nil {
		return s, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id            string
			count, points int64
		)
		if err := rows.Scan(&id, &count, &points); err != nil {
			return s, err
		}
		s.PerPayment[id] = count
		s.Entries += count
		s.EntryPoints += points
	}
	if err := rows.Err(); err != nil {
		return s, err
	}
	err = l.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(points), 0) FROM "+l.balance).Scan(&s.BalanceTotal)
	return s, err
}
