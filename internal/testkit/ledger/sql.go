package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// SQLConfig configures a SQL.
type SQLConfig struct {
	// Dialect is the database's SQL flavour: sqlstore.Postgres,
	// sqlstore.MySQL or sqlstore.SQLite. Required.
	Dialect sqlstore.Dialect

	// Table is the effects table, unique to the test or run (tests share
	// databases): lowercase ASCII letters, digits and underscores, at most
	// 48 bytes. The balances go to Table+"_balance". Required.
	Table string

	// RequireTx makes Record fail with ErrNoTx unless ctx carries an
	// inbox transaction (sqlstore.TxFromContext): for a test of the
	// transactional inbox, an effect written beside the transaction is a
	// bug to report, not to paper over. Otherwise Record writes in a
	// transaction of its own.
	RequireTx bool
}

// SQL is a Ledger in two tables of a SQL database (PostgreSQL,
// MySQL/MariaDB or SQLite): one row per effect, and a balance per account.
// Inside a transactional-inbox handler Record writes in the inbox
// transaction, so the effect commits or rolls back with the dedup record.
//
// NewSQL creates no table: call CreateTables once (a test's setup),
// and DropTables at the end; a process that only records (a child
// consumer) just opens the ledger.
type SQL struct {
	db        *sql.DB
	cfg       SQLConfig
	balance   string
	insert    string
	upsert    string
	selectAll string
}

var _ Ledger = (*SQL)(nil)

// maxLedgerTable bounds SQLConfig.Table, leaving room for the
// balance table's suffix under MySQL's 64-byte identifiers.
const maxLedgerTable = 48

// NewSQL returns the ledger in cfg.Table of db. It runs no SQL.
func NewSQL(db *sql.DB, cfg SQLConfig) (*SQL, error) {
	if db == nil {
		return nil, errors.New("testkit: NewSQL: db is nil")
	}
	switch cfg.Dialect {
	case sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite:
	default:
		return nil, fmt.Errorf("testkit: SQLConfig.Dialect must be %q, %q or %q, got %q", sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite, cfg.Dialect)
	}
	if err := checkIdent(cfg.Table, maxLedgerTable); err != nil {
		return nil, fmt.Errorf("testkit: SQLConfig.Table: %w", err)
	}
	l := &SQL{db: db, cfg: cfg, balance: cfg.Table + "_balance"}
	l.insert = l.bind("INSERT INTO " + cfg.Table + " (event_id, effect_key, account, amount, message_id) VALUES (?, ?, ?, ?, ?)")
	if cfg.Dialect == sqlstore.MySQL {
		l.upsert = "INSERT INTO " + l.balance + " (account, amount) VALUES (?, ?) ON DUPLICATE KEY UPDATE amount = amount + VALUES(amount)"
	} else {
		l.upsert = l.bind("INSERT INTO " + l.balance + " (account, amount) VALUES (?, ?) ON CONFLICT (account) DO UPDATE SET amount = " + l.balance + ".amount + excluded.amount")
	}
	l.selectAll = "SELECT event_id, effect_key, account, amount, message_id FROM " + cfg.Table + " ORDER BY seq"
	return l, nil
}

// checkIdent accepts lowercase ASCII letters, digits and underscores, not
// starting with a digit, at most max bytes: names that need no quoting in
// any of the three dialects.
func checkIdent(name string, max int) error {
	if name == "" {
		return errors.New("empty")
	}
	if len(name) > max {
		return fmt.Errorf("%q is %d bytes, more than %d", name, len(name), max)
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return fmt.Errorf("%q: only lowercase ASCII letters, digits and underscores, not starting with a digit", name)
		}
	}
	return nil
}

// Tables returns the ledger's tables: effects, then balances.
func (l *SQL) Tables() []string { return []string{l.cfg.Table, l.balance} }

// CreateTables creates the ledger's tables if they do not exist.
func (l *SQL) CreateTables(ctx context.Context) error {
	for _, stmt := range l.schema() {
		if _, err := l.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("testkit: create the ledger tables %s: %w", l.cfg.Table, err)
		}
	}
	return nil
}

// DropTables drops the ledger's tables, and only those.
func (l *SQL) DropTables(ctx context.Context) error {
	var errs []error
	for _, t := range l.Tables() {
		if _, err := l.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			errs = append(errs, fmt.Errorf("testkit: drop %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

func (l *SQL) schema() []string {
	t, b := l.cfg.Table, l.balance
	switch l.cfg.Dialect {
	case sqlstore.Postgres:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
    seq        BIGSERIAL PRIMARY KEY,
    event_id   TEXT NOT NULL,
    effect_key TEXT NOT NULL,
    account    TEXT NOT NULL,
    amount     BIGINT NOT NULL,
    message_id TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + b + ` (
    account TEXT PRIMARY KEY,
    amount  BIGINT NOT NULL)`,
		}
	case sqlstore.MySQL:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
    seq        BIGINT AUTO_INCREMENT PRIMARY KEY,
    event_id   VARCHAR(255) NOT NULL,
    effect_key VARCHAR(255) NOT NULL,
    account    VARCHAR(255) NOT NULL,
    amount     BIGINT NOT NULL,
    message_id VARCHAR(255) NOT NULL) ENGINE = InnoDB`,
			`CREATE TABLE IF NOT EXISTS ` + b + ` (
    account VARCHAR(255) PRIMARY KEY,
    amount  BIGINT NOT NULL) ENGINE = InnoDB`,
		}
	default:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id   TEXT NOT NULL,
    effect_key TEXT NOT NULL,
    account    TEXT NOT NULL,
    amount     INTEGER NOT NULL,
    message_id TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + b + ` (
    account TEXT PRIMARY KEY,
    amount  INTEGER NOT NULL)`,
		}
	}
}

// bind rewrites ? placeholders as $1, $2... for PostgreSQL.
func (l *SQL) bind(q string) string {
	if l.cfg.Dialect != sqlstore.Postgres {
		return q
	}
	out := make([]byte, 0, len(q)+8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = fmt.Appendf(out, "$%d", n)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

// execer is what write needs of a *sql.Tx or a *sql.DB.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Record writes e: in the inbox transaction ctx carries when there is one
// (the middleware commits or rolls it back), otherwise in a transaction of
// its own, or fails with ErrNoTx under RequireTx.
func (l *SQL) Record(ctx context.Context, e Effect) error {
	if e.Event == "" {
		return errNoEvent
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		return l.write(ctx, tx, e)
	}
	if l.cfg.RequireTx {
		return ErrNoTx
	}
	if e.Account == "" {
		return l.write(ctx, l.db, e) // one statement: atomic as it is
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("testkit: ledger: %w", err)
	}
	if err := l.write(ctx, tx, e); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("testkit: ledger: commit: %w", err)
	}
	return nil
}

func (l *SQL) write(ctx context.Context, x execer, e Effect) error {
	if _, err := x.ExecContext(ctx, l.insert, e.Event, e.Key, e.Account, e.Amount, e.Message); err != nil {
		return fmt.Errorf("testkit: ledger entry: %w", err)
	}
	if e.Account == "" {
		return nil
	}
	if _, err := x.ExecContext(ctx, l.upsert, e.Account, e.Amount); err != nil {
		return fmt.Errorf("testkit: ledger balance: %w", err)
	}
	return nil
}

// Effects returns every committed effect, in the order recorded.
func (l *SQL) Effects(ctx context.Context) ([]Effect, error) {
	rows, err := l.db.QueryContext(ctx, l.selectAll)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		var e Effect
		if err := rows.Scan(&e.Event, &e.Key, &e.Account, &e.Amount, &e.Message); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Totals sums up the committed effects and balances.
func (l *SQL) Totals(ctx context.Context) (Totals, error) {
	t := Totals{PerEvent: map[string]int64{}, PerKey: map[string]int64{}}
	if err := l.group(ctx, "SELECT event_id, COUNT(*), COALESCE(SUM(amount), 0) FROM "+l.cfg.Table+" GROUP BY event_id", func(id string, n, amount int64) {
		t.PerEvent[id] = n
		t.Effects += n
		t.Amount += amount
	}); err != nil {
		return t, err
	}
	if err := l.group(ctx, "SELECT effect_key, COUNT(*), 0 FROM "+l.cfg.Table+" WHERE effect_key <> '' GROUP BY effect_key", func(key string, n, _ int64) {
		t.PerKey[key] = n
	}); err != nil {
		return t, err
	}
	err := l.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(amount), 0) FROM "+l.balance).Scan(&t.Balance)
	return t, err
}

func (l *SQL) group(ctx context.Context, q string, each func(id string, n, amount int64)) error {
	rows, err := l.db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id        string
			n, amount int64
		)
		if err := rows.Scan(&id, &n, &amount); err != nil {
			return err
		}
		each(id, n, amount)
	}
	return rows.Err()
}
