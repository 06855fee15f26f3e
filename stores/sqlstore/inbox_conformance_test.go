package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestInboxConformance runs the Inbox conformance suite on every dialect:
// Begin in its own transaction, and joined to a caller's transaction
// (sqlstore.WithTx). On PostgreSQL the joined transaction is ended by a
// failed statement, on MySQL/MariaDB by a lost deadlock. SQLite runs
// joined mode on one transaction at a time: BEGIN IMMEDIATE takes the
// database's write lock, so a second transaction waits in its own BEGIN,
// never in the store's Begin, and a statement that fails does not end
// the transaction.
func TestInboxConformance(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
			return newInboxFixture(t, b.open(t), b.dialect, sqlstore.Config{Clock: clock})
		})
	})
}

// TestPartitionedInboxConformance runs the Inbox suite on the PostgreSQL
// daily-partitioned layout, whose Begin takes advisory locks.
func TestPartitionedInboxConformance(t *testing.T) {
	db := openPostgres(t)
	storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
		return newInboxFixture(t, db, sqlstore.Postgres, partitionedConfig(clock))
	})
}

// newInboxFixture returns the storetest fixture of a new store over db
// (cfg's table, a fresh one by default) and of an effects table of its
// own; t.Cleanup drops both.
func newInboxFixture(t *testing.T, db *sql.DB, d sqlstore.Dialect, cfg sqlstore.Config) storetest.InboxFixture {
	t.Helper()
	s := newStore(t, db, d, cfg)
	fx := newEffectsTable(t, db, d)
	fx.Store = s
	fx.BeginOuter = func(ctx context.Context) (storetest.OuterTx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return sqlOuter{tx}, nil
	}
	switch d {
	case sqlstore.Postgres:
		fx.AbortOuter = []storetest.OuterAbort{{Name: "failed-statement", Abort: pgFailStatement}}
	case sqlstore.MySQL:
		fx.AbortOuter = []storetest.OuterAbort{{Name: "deadlock", Abort: mysqlDeadlockAbort(t, db)}}
	case sqlstore.SQLite:
		fx.OuterExclusive = true
	}
	return fx
}

// newEffectsTable creates the business table of an Inbox fixture: one
// row per effect, with no key, so a duplicate effect is a second row.
// It returns a fixture with WriteEffect and CountEffects set.
func newEffectsTable(t *testing.T, db *sql.DB, d sqlstore.Dialect) storetest.InboxFixture {
	t.Helper()
	fx, _ := newEffectsTableNamed(t, db, d)
	return fx
}

// newEffectsTableNamed is newEffectsTable, which also returns the table.
func newEffectsTableNamed(t *testing.T, db *sql.DB, d sqlstore.Dialect) (storetest.InboxFixture, string) {
	t.Helper()
	table := "effects_" + storetest.NewID()
	ddl := fmt.Sprintf(`CREATE TABLE "%s" (k TEXT NOT NULL)`, table)
	if d == sqlstore.MySQL {
		ddl = fmt.Sprintf("CREATE TABLE `%s` (k VARCHAR(1024) NOT NULL) ENGINE = InnoDB", table)
	}
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatalf("creating %s: %v", table, err)
	}
	t.Cleanup(func() { dropTable(t, db, d, table) })
	return storetest.InboxFixture{
		WriteEffect: func(ctx context.Context, key string) error {
			tx, ok := sqlstore.TxFromContext(ctx)
			if !ok {
				return errors.New("no transaction in the context (sqlstore.TxFromContext)")
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (k) VALUES (%s)", table, ph(d, 1)), key)
			return err
		},
		CountEffects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE k = %s", table, ph(d, 1)), key).Scan(&n)
			return n, err
		},
	}, table
}

// sqlOuter is a caller's *sql.Tx as a storetest.OuterTx.
type sqlOuter struct{ tx *sql.Tx }

func (o sqlOuter) Context(parent context.Context) context.Context {
	return sqlstore.WithTx(parent, o.tx)
}

func (o sqlOuter) Commit(context.Context) error { return o.tx.Commit() }

func (o sqlOuter) Rollback(context.Context) error { return o.tx.Rollback() }

// pgFailStatement aborts a PostgreSQL transaction the way any failed
// statement does: the server refuses every later statement of it
// (SQLSTATE 25P02) until it is rolled back.
func pgFailStatement(ctx context.Context, outer storetest.OuterTx) error {
	tx := outer.(sqlOuter).tx
	if _, err := tx.ExecContext(ctx, "SELECT 1/0"); err == nil {
		return errors.New("SELECT 1/0 succeeded")
	}
	var one int
	err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) || pg.SQLState() != "25P02" {
		return fmt.Errorf("after a failed statement the transaction still answers (%v): it was not aborted", err)
	}
	return nil
}

// mysqlDeadlockAbort returns an AbortOuter for MySQL/MariaDB: the outer
// transaction loses a deadlock against a heavier transaction, so InnoDB
// rolls all of it back on the server while the client's *sql.Tx stays
// open (its later statements would run in autocommit). Its table is made
// on first use and dropped by t.Cleanup.
func mysqlDeadlockAbort(t *testing.T, db *sql.DB) func(ctx context.Context, outer storetest.OuterTx) error {
	var (
		once  sync.Once
		table = "abort_" + storetest.NewID()
		err   error
	)
	return func(ctx context.Context, outer storetest.OuterTx) error {
		once.Do(func() {
			if _, err = db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB"); err != nil {
				return
			}
			t.Cleanup(func() { dropTable(t, db, sqlstore.MySQL, table) })
			rows := make([]string, 64)
			for i := range rows {
				rows[i] = fmt.Sprintf("(%d, 0)", i)
			}
			_, err = db.ExecContext(ctx, "INSERT INTO "+table+" VALUES "+strings.Join(rows, ", "))
		})
		if err != nil {
			return fmt.Errorf("preparing the deadlock table: %w", err)
		}
		return mysqlLoseDeadlock(ctx, db, outer.(sqlOuter).tx, table)
	}
}

// mysqlLoseDeadlock makes outer the victim of a deadlock on table's rows
// 0 and 1. InnoDB rolls back the transaction that changed fewer rows:
// the other one first changes every row but 0.
func mysqlLoseDeadlock(ctx context.Context, db *sql.DB, outer *sql.Tx, table string) error {
	heavy, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = heavy.Rollback() }()
	if _, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id >= 1"); err != nil {
		return fmt.Errorf("heavy transaction: %w", err)
	}
	if _, err := outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0"); err != nil {
		return fmt.Errorf("outer transaction: %w", err)
	}
	heavyDone := make(chan error, 1)
	go func() {
		// Waits for outer's row 0...
		_, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0")
		heavyDone <- err
	}()
	// ...while outer waits for heavy's row 1: whichever comes second
	// closes the cycle, and InnoDB picks outer, the lighter, as victim.
	_, victimErr := outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 1")
	var my *mysql.MySQLError
	if !errors.As(victimErr, &my) || my.Number != 1213 {
		_ = outer.Rollback() // let heavy through
		return fmt.Errorf("outer transaction's second update = %v (heavy's: %v), want a deadlock (1213)", victimErr, <-heavyDone)
	}
	heavyErr := <-heavyDone
	if heavyErr != nil {
		return fmt.Errorf("heavy transaction after the deadlock: %w", heavyErr)
	}
	return nil
}
