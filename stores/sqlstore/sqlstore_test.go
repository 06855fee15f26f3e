package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestConformance runs the suite on every dialect with group commit on
// (the default) and off.
func TestConformance(t *testing.T) {
	forEachBatching(t, func(t *testing.T, b backend, off bool) {
		storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
			return newStore(t, b.open(t), b.dialect, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{Disabled: off}})
		}, storetest.AdminNoScopes())
	})
}

// forEachBatching runs fn on every dialect with group commit on (the
// default, "batched") and off ("unbatched").
func forEachBatching(t *testing.T, fn func(t *testing.T, b backend, off bool)) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		for _, off := range []bool{false, true} {
			name := "batched"
			if off {
				name = "unbatched"
			}
			t.Run(name, func(t *testing.T) { fn(t, b, off) })
		}
	})
}

// noSQL is a driver that fails any use: a store built over it must not
// touch the database.
type noSQL struct{ t *testing.T }

func (d noSQL) Open(string) (driver.Conn, error) {
	d.t.Error("the driver was used")
	return nil, errors.New("no SQL allowed")
}

func TestHostileTableNames(t *testing.T) {
	sql.Register("sqlstore-nosql-"+t.Name(), noSQL{t})
	db, err := sql.Open("sqlstore-nosql-"+t.Name(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, name := range []string{
		"x; DROP TABLE y",
		"x;DROP TABLE y--",
		`x" ; DROP TABLE "y`,
		"x` ; DROP TABLE `y",
		"x'",
		"x y",
		"X",
		"Dedup",
		"1abc",
		"a.b.c",
		".x",
		"x.",
		"sch\u0435ma.x", // Cyrillic e
		"x\x00",
		"x-y",
		"x/*",
		strings.Repeat("a", 49),
	} {
		for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite} {
			cfg := sqlstore.Config{Dialect: d, Table: name}
			if err := cfg.Validate(); !errors.Is(err, sqlstore.ErrInvalidTable) {
				t.Errorf("Validate(%s, Table %q) = %v, want ErrInvalidTable", d, name, err)
			}
			if _, err := sqlstore.New(db, cfg); !errors.Is(err, sqlstore.ErrInvalidTable) {
				t.Errorf("New(%s, Table %q) = %v, want ErrInvalidTable", d, name, err)
			}
		}
	}
	// Schema-qualified names are fine on the servers, not on SQLite.
	if err := (sqlstore.Config{Dialect: sqlstore.Postgres, Table: "inbox.dedup"}).Validate(); err != nil {
		t.Errorf("schema.table on PostgreSQL: %v", err)
	}
	if err := (sqlstore.Config{Dialect: sqlstore.SQLite, Table: "main.dedup"}).Validate(); !errors.Is(err, sqlstore.ErrInvalidTable) {
		t.Errorf("schema.table on SQLite: %v, want ErrInvalidTable", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  sqlstore.Config
		want string
	}{
		{sqlstore.Config{Dialect: "oracle"}, "Dialect"},
		{sqlstore.Config{PurgeInterval: -1}, "PurgeInterval"},
		{sqlstore.Config{PurgeBatch: -1}, "PurgeBatch"},
		{sqlstore.Config{PurgeBatch: sqlstore.MaxPurgeBatch + 1}, "100000"},
		{sqlstore.Config{PurgeGrace: -time.Second}, "PurgeGrace"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := (sqlstore.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

func TestDetectDialect(t *testing.T) {
	for _, b := range backends {
		var db *sql.DB
		switch b.dialect {
		case sqlstore.SQLite:
			db = openSQLite(t)
		default:
			// sql.Open does not connect: no server needed.
			var err error
			driverName := map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.MySQL: "mysql"}[b.dialect]
			db, err = sql.Open(driverName, "")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
		}
		d, err := sqlstore.DetectDialect(db)
		if err != nil || d != b.dialect {
			t.Errorf("DetectDialect = %q, %v; want %q", d, err, b.dialect)
		}
	}
}

func TestNeverClosesDB(t *testing.T) {
	db := openSQLite(t)
	s := newStore(t, db, sqlstore.SQLite, sqlstore.Config{PurgeInterval: time.Millisecond})
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("db unusable after Close: %v", err)
	}
	if _, err := s.Begin(context.Background(), "s", []string{"k"}, time.Hour); !errors.Is(err, stores.ErrClosed) {
		t.Fatalf("Begin after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Purge(context.Background()); !errors.Is(err, stores.ErrClosed) {
		t.Fatalf("Purge after Close = %v, want ErrClosed", err)
	}
}

// TestAdminRecordID: the ID the admin interface reports is RecordID as a
// UUID, the id column of the table; a List cursor takes it with or
// without dashes; and every dialect reports the table's size.
func TestAdminRecordID(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newStore(t, b.open(t), b.dialect, sqlstore.Config{})
		c, err := s.Claim(ctx, "orders", []string{"k"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		r, err := s.Get(ctx, "orders", "k")
		if err != nil {
			t.Fatal(err)
		}
		id := sqlstore.RecordID("orders", "k")
		h := hex.EncodeToString(id[:])
		if want := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]; r.ID != want {
			t.Fatalf("ID = %q, want RecordID %q", r.ID, want)
		}
		for _, after := range []string{r.ID, h} {
			recs, next, err := s.List(ctx, stores.ListOptions{After: after})
			if err != nil || len(recs) != 0 || next != "" {
				t.Fatalf("List after the only record (%q) = %+v, %q, %v", after, recs, next, err)
			}
		}
		_, _, err = s.List(ctx, stores.ListOptions{Scope: "orders"})
		if !errors.Is(err, stores.ErrNotSupported) {
			t.Fatalf("List by scope = %v, want ErrNotSupported", err)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Processing != 1 || st.Bytes <= 0 {
			t.Fatalf("Stats = %+v, want one processing record and the table's size", st)
		}
	})
}

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

// modelPurgeGrace is the PurgeGrace of the stores the model checks:
// longer than any finite lease the model gives but its few hour-long
// ones, so that Purge, run between calls, may forget an expired claim
// only when the contract lets it.
const modelPurgeGrace = 24 * time.Hour

// purge is the store's housekeeping for the model.
func purge(ctx context.Context, s stores.Store) error {
	_, err := s.(*sqlstore.Store).Purge(ctx)
	return err
}

// TestModel checks the store against the model of the Store contract on
// every dialect, with group commit on (the default) and off. Time is the
// fake clock's, truncated to the microsecond; Purge runs between calls.
func TestModel(t *testing.T) {
	forEachBatching(t, func(t *testing.T, b backend, off bool) {
		storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
			return newStore(t, b.open(t), b.dialect, sqlstore.Config{
				Clock:      clock,
				Batch:      sqlstore.BatchConfig{Disabled: off},
				PurgeGrace: modelPurgeGrace,
			})
		}, storetest.Precision(time.Microsecond), storetest.Maintenance(purge))
	})
}

// TestModelPartitioned checks the daily-partitioned layout against the
// model: leases and retentions longer than PartitionDaysAhead are
// refused, and the fake clock stays within the partitions CreateSchema
// made (from the day before to PartitionDaysAhead days after its start).
func TestModelPartitioned(t *testing.T) {
	db := openPostgres(t)
	days := time.Duration(sqlstore.DefaultPartitionDaysAhead) * 24 * time.Hour
	storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
		cfg := partitionedConfig(clock)
		cfg.PurgeGrace = modelPurgeGrace
		return newStore(t, db, sqlstore.Postgres, cfg)
	}, storetest.Precision(time.Microsecond), storetest.Maintenance(purge),
		storetest.MaxDuration(days), storetest.MaxElapsed(12*time.Hour))
}
