package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// mysqlWith opens MariaDB/MySQL with the DSN options opts added to the
// test DSN, and closes it after t.
func mysqlWith(t *testing.T, opts map[string]string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testkit.RequireMySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for k, v := range opts {
		switch k {
		case "clientFoundRows":
			cfg.ClientFoundRows = v == "true"
		case "interpolateParams":
			cfg.InterpolateParams = v == "true"
		default:
			cfg.Params[k] = v
		}
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		testkit.Unavailable(t, "MySQL/MariaDB", cfg.Addr, err)
	}
	return db
}

// TestClientFoundRows: with go-sql-driver's clientFoundRows=true an
// INSERT ... ON DUPLICATE KEY UPDATE that finds its row unchanged reports
// one row affected, as an insert does. Neither the claim nor the inbox may
// take that for a fresh record.
func TestClientFoundRows(t *testing.T) {
	db := mysqlWith(t, map[string]string{"clientFoundRows": "true"})
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			ctx := context.Background()
			s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{Batch: sqlstore.BatchConfig{Disabled: !batched}})
			for _, keys := range [][]string{{"one"}, {"a", "b"}} {
				c, err := s.Claim(ctx, "scope", keys, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("first Claim(%q) = %+v, %v; want Claimed", keys, c, err)
				}
				again, err := s.Claim(ctx, "scope", keys, time.Minute)
				if err != nil || again.Result != stores.InProgress {
					t.Fatalf("second Claim(%q) while held = %+v, %v; want InProgress", keys, again, err)
				}
				if err := s.Complete(ctx, c, time.Hour, []byte("out")); err != nil {
					t.Fatal(err)
				}
				dup, err := s.Claim(ctx, "scope", keys, time.Minute)
				if err != nil || dup.Result != stores.Duplicate || string(dup.Data) != "out" {
					t.Fatalf("Claim(%q) after Complete = %+v, %v; want Duplicate with data", keys, dup, err)
				}
			}
			for _, keys := range [][]string{{"inbox"}, {"x", "y"}} {
				tx, err := s.Begin(ctx, "scope", keys, time.Hour)
				if err != nil || tx.Result() != stores.Claimed {
					t.Fatalf("first Begin(%q) = %v, %v; want Claimed", keys, tx, err)
				}
				if err := tx.Commit(ctx, []byte("done")); err != nil {
					t.Fatal(err)
				}
				tx, err = s.Begin(ctx, "scope", keys, time.Hour)
				if err != nil || tx.Result() != stores.Duplicate || string(tx.Data()) != "done" {
					t.Fatalf("Begin(%q) after Commit = %v, %v; want Duplicate with data", keys, tx, err)
				}
			}
		})
	}
}

// deadlockVictim makes the MySQL transaction outer lose a deadlock against
// a heavier transaction of its own: the server then rolls all of outer
// back, while the client's *sql.Tx stays open. It returns the error outer
// saw (1213).
func deadlockVictim(t *testing.T, db *sql.DB, outer *sql.Tx) error {
	t.Helper()
	ctx := context.Background()
	table := "deadlock_" + storetest.NewID()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqltest.DropTable(t, db, sqlstore.MySQL, table) })
	var rows []string
	for i := range 200 {
		rows = append(rows, fmt.Sprintf("(%d, 0)", i))
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" VALUES "+strings.Join(rows, ", ")); err != nil {
		t.Fatal(err)
	}
	heavy, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = heavy.Rollback() }()
	// heavy locks many rows (so the server picks outer as the victim),
	// including row 1; outer locks row 0.
	if _, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id >= 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0"); err != nil {
		t.Fatal(err)
	}
	heavyDone := make(chan error, 1)
	go func() {
		// Waits for outer's lock on row 0...
		_, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0")
		heavyDone <- err
	}()
	// ...until outer waits for heavy's row 1: a deadlock, outer the victim.
	deadline := time.Now().Add(10 * time.Second)
	var victimErr error
	for time.Now().Before(deadline) {
		_, victimErr = outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 1")
		var my *mysql.MySQLError
		if errors.As(victimErr, &my) && my.Number == 1213 {
			break
		}
		if victimErr != nil {
			t.Fatalf("outer's second update: %v, want a deadlock", victimErr)
		}
		t.Fatal("outer's second update succeeded: no deadlock")
	}
	if err := <-heavyDone; err != nil {
		t.Fatalf("heavy transaction: %v", err)
	}
	return victimErr
}

// TestJoinedTxDeadOnMySQL: a deadlock rolls a whole MySQL transaction back
// on the server, but the client's *sql.Tx stays open, and watermill-sql
// redelivers a nacked message inside it. A Begin joined to such a
// transaction must fail with ErrTxAborted and write nothing: its
// statements would otherwise run in autocommit, committing the record of
// a message whose handler failed (the message would then be acked as a
// duplicate with no effect ever applied).
func TestJoinedTxDeadOnMySQL(t *testing.T) {
	db := sqltest.OpenMySQL(t)
	ctx := context.Background()
	s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{})
	l := sqltest.NewLedger(t, db, sqlstore.MySQL, 1)

	t.Run("handler deadlocks", func(t *testing.T) {
		outer, octx, itx := joinedClaim(t, db, s, "k1")
		// The handler writes, then loses a deadlock: the server rolls
		// the outer transaction back.
		if err := l.Add(ctx, outer, 0, 10); err != nil {
			t.Fatal(err)
		}
		_ = deadlockVictim(t, db, outer)
		rerr := itx.Rollback(ctx)
		if !errors.Is(rerr, stores.ErrTxAborted) {
			t.Errorf("Rollback after the server rolled the transaction back = %v, want ErrTxAborted", rerr)
		}
		// The redelivery, in the same (dead) transaction.
		again, err := s.Begin(octx, "scope", []string{"k1"}, time.Hour)
		if !errors.Is(err, stores.ErrTxAborted) {
			if err == nil {
				_ = again.Rollback(ctx)
			}
			t.Fatalf("Begin in a dead joined transaction = %v, %v; want ErrTxAborted", again, err)
		}
		if n := sqltest.CountRows(t, db, sqlstore.MySQL, s.Table()); n != 0 {
			t.Fatalf("%d dedup records committed outside any transaction", n)
		}
		// A fresh transaction then runs the message.
		fresh, err := s.Begin(ctx, "scope", []string{"k1"}, time.Hour)
		if err != nil || fresh.Result() != stores.Claimed {
			t.Fatalf("Begin in a new transaction = %v, %v; want Claimed", fresh, err)
		}
		_ = fresh.Rollback(ctx)
	})

	t.Run("handler swallows the deadlock", func(t *testing.T) {
		outer, _, itx := joinedClaim(t, db, s, "k2")
		_ = deadlockVictim(t, db, outer)
		if err := itx.Commit(ctx, []byte("outputs")); !errors.Is(err, stores.ErrTxAborted) {
			t.Fatalf("Commit in a dead joined transaction = %v, want ErrTxAborted", err)
		}
		if n := sqltest.CountRows(t, db, sqlstore.MySQL, s.Table()); n != 0 {
			t.Fatalf("%d dedup records committed outside any transaction", n)
		}
	})
}

// joinedClaim begins a transaction on db, which is rolled back as the
// test ends, and key's inbox transaction in scope "scope" on s joined to
// it, and fails t now unless key is claimed. It returns the transaction,
// the context that carries it, and the inbox transaction.
func joinedClaim(t *testing.T, db *sql.DB, s *sqlstore.Store, key string) (*sql.Tx, context.Context, stores.InboxTx) {
	t.Helper()
	ctx := context.Background()
	outer, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outer.Rollback() })
	octx := sqlstore.WithTx(ctx, outer)
	itx, err := s.Begin(octx, "scope", []string{key}, time.Hour)
	if err != nil || itx.Result() != stores.Claimed {
		t.Fatalf("Begin = %v, %v", itx, err)
	}
	return outer, octx, itx
}

// TestJoinedTxAbortedOnPostgres: PostgreSQL refuses every statement of a
// transaction aborted by an earlier error (SQLSTATE 25P02) until it is
// rolled back. Begin joined to one fails with ErrTxAborted.
func TestJoinedTxAbortedOnPostgres(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	ctx := context.Background()
	s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{})
	outer, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = outer.Rollback() }()
	if _, err := outer.ExecContext(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	itx, err := s.Begin(sqlstore.WithTx(ctx, outer), "scope", []string{"k"}, time.Hour)
	if !errors.Is(err, stores.ErrTxAborted) {
		t.Fatalf("Begin in an aborted transaction = %v, %v; want ErrTxAborted", itx, err)
	}
}

// proxiedStore opens the server of b through a TCP proxy the test owns, with
// a store on a table of its own (created directly, so the proxy can be
// cut from the start).
func proxiedStore(t *testing.T, b sqltest.Backend, cfg sqlstore.Config) (*sqlstore.Store, *sql.DB, *testkit.Proxy) {
	t.Helper()
	direct := b.Open(t)
	var driver, target, dsn string
	switch b.Dialect {
	case sqlstore.Postgres:
		driver, target = "pgx", "127.0.0.1:5432"
	case sqlstore.MySQL:
		driver, target = "mysql", "127.0.0.1:3306"
	}
	p := testkit.NewProxy(t, target)
	switch b.Dialect {
	case sqlstore.Postgres:
		dsn = "postgres://postgres@" + p.Addr() + "/test?sslmode=disable&connect_timeout=2"
	case sqlstore.MySQL:
		dsn = "root@tcp(" + p.Addr() + ")/test?timeout=2s"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = db.Close() })
	cfg.Table = "dedup_test_" + storetest.NewID()
	sqltest.NewStore(t, direct, b.Dialect, cfg) // schema and cleanup
	cfg.Dialect = b.Dialect
	s, err := sqlstore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, db, p
}

// within fails t unless fn returns within d: a watchdog for a call that
// must give up by itself (by its context's deadline) while the outage it
// meets lasts, not a bound on how fast a loaded machine runs it. The
// callers give a minute; the outages last until the test ends.
func within(t *testing.T, what string, d time.Duration, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s still blocked after %s", what, d)
		<-done
	}
}

// TestOutageErrorClasses: a database that cannot be reached fails every
// call with an error wrapping stores.ErrUnavailable (the only class a
// fail-open consumer bypasses), and a database that does not answer
// fails it at the call's deadline, with context.DeadlineExceeded — Begin
// and Commit included.
func TestOutageErrorClasses(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		for _, batched := range []bool{true, false} {
			t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
				s, _, p := proxiedStore(t, b, sqlstore.Config{Batch: sqlstore.BatchConfig{Disabled: !batched}})
				bg := context.Background()
				held := testkit.MustClaim(t, s, "s", time.Minute, "held")
				open := sqltest.MustBegin(t, s, "s", "open", time.Hour)

				p.Cut()
				ctx, cancel := context.WithTimeout(bg, 5*time.Second)
				defer cancel()
				_, err := s.Claim(ctx, "s", []string{"a"}, time.Minute)
				errtest.Wraps(t, "Claim, connection refused", err, stores.ErrUnavailable)
				errtest.Wraps(t, "Complete, connection refused", s.Complete(ctx, held, time.Hour, nil), stores.ErrUnavailable)
				_, err = s.Begin(ctx, "s", []string{"b"}, time.Hour)
				errtest.Wraps(t, "Begin, connection refused", err, stores.ErrUnavailable)
				errtest.Wraps(t, "Commit, connection reset", open.Commit(ctx, []byte("x")), stores.ErrUnavailable)
				p.Restore()

				held, err = s.Claim(bg, "s", []string{"held2"}, time.Minute)
				if err != nil {
					t.Fatalf("Claim after Restore: %v", err)
				}
				open, err = s.Begin(bg, "s", []string{"open2"}, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				p.Blackhole()
				defer p.Restore()
				short := func() (context.Context, context.CancelFunc) {
					return context.WithTimeout(bg, 300*time.Millisecond)
				}
				for _, c := range []struct {
					what string
					call func(ctx context.Context) error
				}{
					{"Claim", func(ctx context.Context) error {
						_, err := s.Claim(ctx, "s", []string{"c"}, time.Minute)
						return err
					}},
					{"Complete", func(ctx context.Context) error { return s.Complete(ctx, held, time.Hour, nil) }},
					{"Begin", func(ctx context.Context) error {
						_, err := s.Begin(ctx, "s", []string{"d"}, time.Hour)
						return err
					}},
				} {
					within(t, c.what+" on a blackholed database", time.Minute, func() {
						ctx, cancel := short()
						defer cancel()
						errtest.Wraps(t, c.what+", no answer", c.call(ctx), context.DeadlineExceeded)
					})
				}
				within(t, "Commit on a blackholed database", time.Minute, func() {
					ctx, cancel := short()
					defer cancel()
					if err := open.Commit(ctx, nil); err == nil {
						t.Error("Commit on a blackholed database succeeded")
					}
				})
			})
		}
	})
}

// TestMySQLUserAutoIncrementColumn: a column a user adds to the table
// (an AUTO_INCREMENT sequence for change data capture, say) gives every
// fresh INSERT a last insert id. The store must still tell an inserted
// record from an existing one: taking the fresh record for an existing
// one made Begin a Duplicate (the message acked without its effect) and
// multi-key claims InProgress for ever.
func TestMySQLUserAutoIncrementColumn(t *testing.T) {
	db := sqltest.OpenMySQL(t)
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{Batch: sqlstore.BatchConfig{Disabled: !batched}})
			ctx := context.Background()
			if _, err := db.ExecContext(ctx, "ALTER TABLE `"+s.Table()+"` ADD COLUMN seq BIGINT NOT NULL AUTO_INCREMENT UNIQUE"); err != nil {
				t.Fatal(err)
			}
			for _, keys := range [][]string{{"one"}, {"a", "b"}} {
				tx, err := s.Begin(ctx, "inbox", keys, time.Hour)
				if err != nil || tx.Result() != stores.Claimed {
					t.Fatalf("Begin(%q) of fresh keys = %v, %v; want Claimed", keys, tx, err)
				}
				if err := tx.Commit(ctx, nil); err != nil {
					t.Fatal(err)
				}
				if tx, err := s.Begin(ctx, "inbox", keys, time.Hour); err != nil || tx.Result() != stores.Duplicate {
					t.Fatalf("Begin(%q) after Commit = %v, %v; want Duplicate", keys, tx, err)
				}
				c, err := s.Claim(ctx, "lease", keys, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(%q) of fresh keys = %+v, %v; want Claimed", keys, c, err)
				}
				if again, err := s.Claim(ctx, "lease", keys, time.Minute); err != nil || again.Result != stores.InProgress {
					t.Fatalf("Claim(%q) while held = %+v, %v; want InProgress", keys, again, err)
				}
			}
		})
	}
}

// TestMySQLAutocommitOffRefused: with autocommit=0 in the DSN (passed on
// to the session by go-sql-driver), the store's single statements open
// transactions nobody commits: every Complete "succeeds" and is then
// rolled back when the connection closes, so the record never exists for
// anyone else. The store refuses such a database with an error naming the
// setting instead.
func TestMySQLAutocommitOffRefused(t *testing.T) {
	direct := sqltest.OpenMySQL(t)
	cfg := sqlstore.Config{Dialect: sqlstore.MySQL, Table: "dedup_test_" + storetest.NewID()}
	sqltest.NewStore(t, direct, sqlstore.MySQL, cfg) // the table, and its removal
	// Opened after: closed before the table is dropped, so that no open
	// implicit transaction of an autocommit=0 connection holds the drop.
	db := mysqlWith(t, map[string]string{"autocommit": "0"})
	s, err := sqlstore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := context.Background()
	_, err = s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if !errors.Is(err, sqlstore.ErrSessionSettings) || !strings.Contains(err.Error(), "autocommit") {
		t.Fatalf("Claim on a session with autocommit=0 = %v; want ErrSessionSettings naming autocommit", err)
	}
	if _, err := s.Begin(ctx, "s", []string{"k"}, time.Minute); !errors.Is(err, sqlstore.ErrSessionSettings) {
		t.Fatalf("Begin on a session with autocommit=0 = %v; want ErrSessionSettings", err)
	}
	if errors.Is(err, stores.ErrUnavailable) {
		t.Fatal("a session setting is not an outage")
	}
}

// TestJoinedCommitLocksOnlyItsRecords: a joined Commit stores the data on
// the records its transaction inserted, and the outer transaction (a
// watermill-sql subscriber's, REPEATABLE READ on MySQL) stays open until
// the message is acked. Meanwhile another consumer's Begin of another key
// must not wait for it: a statement that finds the records through the
// expires_at index locks the index range after them, where every newer
// record goes.
func TestJoinedCommitLocksOnlyItsRecords(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{})
		ctx := context.Background()
		outer, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer outer.Rollback()
		itx, err := s.Begin(sqlstore.WithTx(ctx, outer), "s", []string{"first"}, time.Hour)
		if err != nil || itx.Result() != stores.Claimed {
			t.Fatal(itx, err)
		}
		if err := itx.Commit(ctx, []byte("outputs")); err != nil {
			t.Fatal(err)
		}
		// The outer transaction is still open. Another consumer:
		// A Begin that waited on the open transaction's locks would wait
		// until it ends, after the test: the deadline only bounds that.
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		other, err := s.Begin(bctx, "s", []string{"second"}, 2*time.Hour)
		if err != nil {
			t.Fatalf("Begin of another key while a joined Commit's transaction is open = %v; it waited on that transaction's locks", err)
		}
		_ = other.Rollback(ctx)
	})
}

// TestMySQLCommitOnDeadServerDoesNotHoldClose: go-sql-driver cannot
// cancel a COMMIT, so one the database does not answer is abandoned at its
// context's deadline and runs on until its connection dies (minutes, on a
// blackholed network). Close must not wait for it, and a Commit made after
// Close is bounded by its context all the same.
func TestMySQLCommitOnDeadServerDoesNotHoldClose(t *testing.T) {
	s, _, p := proxiedStore(t, sqltest.Backend{Dialect: sqlstore.MySQL, Open: sqltest.OpenMySQL}, sqlstore.Config{})
	ctx := context.Background()
	first, second := sqltest.MustBegin(t, s, "s", "a", time.Hour), sqltest.MustBegin(t, s, "s", "b", time.Hour)
	p.Blackhole()
	defer p.Restore()
	commit := func(tx stores.InboxTx) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := tx.Commit(cctx, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Commit on a server that does not answer = %v, want its deadline", err)
		}
	}
	within(t, "Commit on a server that does not answer", time.Minute, func() { commit(first) })
	within(t, "Close with a Commit abandoned on a dead connection", time.Minute, func() {
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	within(t, "Commit after Close on a server that does not answer", time.Minute, func() { commit(second) })
}
