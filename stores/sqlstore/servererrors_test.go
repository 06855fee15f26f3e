package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// The errors servers really return when they cannot serve now,
// reproduced: each must reach the caller as stores.ErrUnavailable (the
// outage class). TestClassify (classify_internal_test.go) checks the
// classification of every code the README lists; these check that the
// drivers deliver them so.

// blockedClaim starts a Claim of key that waits for the row lock of an
// open inbox transaction (on a second store over holder), runs kill on
// the waiting connection once the database shows it waiting (wait is the
// query listing the ids of the waiting connections), and returns the
// Claim's error.
func blockedClaim(t *testing.T, s, holder *sqlstore.Store, admin *sql.DB, wait string, kill func(id int64)) error {
	t.Helper()
	ctx := context.Background()
	tx, err := holder.Begin(ctx, "s", []string{"held"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	done := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, "s", []string{"held"}, time.Minute)
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var id int64
		err := admin.QueryRowContext(ctx, wait, "%"+s.Table()+"%").Scan(&id)
		if err == nil {
			kill(id)
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the Claim ended before it waited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the Claim never waited for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return <-done
}

// TestPostgresBackendTerminated: pg_terminate_backend of the store's own
// backend while it waits (57P01 admin_shutdown, which a fast shutdown
// also sends) is no known outage while the database serves every other
// session: a new connection is answered (as MySQL's KILL,
// TestMySQLConnectionKilled).
func TestPostgresBackendTerminated(t *testing.T) {
	db := sqltest.SharedDB(t, "pgx", testkit.RequirePostgres(t))
	table := "dedup_test_" + storetest.NewID()
	s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{Table: table, Batch: sqlstore.BatchConfig{Disabled: true}})
	holder, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.Postgres, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	err = blockedClaim(t, s, holder, db,
		"SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 LIMIT 1",
		func(pid int64) {
			if _, err := db.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Fatal(err)
			}
		})
	if err == nil || errors.Is(err, stores.ErrUnavailable) {
		t.Fatalf("Claim whose backend was terminated, the database serving: %v, want an error that is no outage", err)
	}
}

// TestPostgresRoleConnectionLimit: a role at its CONNECTION LIMIT
// (53300 too_many_connections) is an outage.
func TestPostgresRoleConnectionLimit(t *testing.T) {
	admin := sqltest.SharedDB(t, "pgx", testkit.RequirePostgres(t))
	role := "dedup_test_" + storetest.NewID()
	if _, err := admin.Exec("CREATE ROLE " + role + " LOGIN CONNECTION LIMIT 1"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", fmt.Sprintf("postgres://%s@127.0.0.1:5432/test?sslmode=disable", role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		if _, err := admin.Exec("DROP ROLE " + role); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	ctx := context.Background()
	conn, err := db.Conn(ctx) // the role's one connection
	if err != nil {
		testkit.Unavailable(t, "PostgreSQL (role login)", role, err)
	}
	defer conn.Close()
	s, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.Postgres, Table: "dedup_test_" + storetest.NewID()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, "s", []string{"k"}, time.Minute)
	errtest.Wraps(t, "Claim of a role out of connections", err, stores.ErrUnavailable)
}

// TestMySQLConnectionKilled: KILL of the store's own connection while it
// waits fails the claim, and is no outage: the connection broke with no
// word of why ("invalid connection"), and a new connection finds the
// database serving (an outage only with the server's own word for it,
// MariaDB's 1927, or when a new connection finds nothing listening).
func TestMySQLConnectionKilled(t *testing.T) {
	db := sqltest.OpenMySQL(t)
	table := "dedup_test_" + storetest.NewID()
	s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{Table: table, Batch: sqlstore.BatchConfig{Disabled: true}})
	// The holder runs on a connection of its own whose id the query
	// below excludes: a connection whose statement has just returned can
	// still show as running it in PROCESSLIST, and KILL of the holder
	// would end its transaction and let the Claim through.
	holderDB, err := sql.Open("mysql", testkit.RequireMySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holderDB.Close() })
	holderDB.SetMaxOpenConns(1)
	holderDB.SetMaxIdleConns(1)
	var holderID int64
	if err := holderDB.QueryRow("SELECT CONNECTION_ID()").Scan(&holderID); err != nil {
		t.Fatal(err)
	}
	holder, err := sqlstore.New(holderDB, sqlstore.Config{Dialect: sqlstore.MySQL, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	err = blockedClaim(t, s, holder, db,
		fmt.Sprintf("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND IN ('Query', 'Execute') AND INFO LIKE ? AND ID <> CONNECTION_ID() AND ID <> %d LIMIT 1", holderID),
		func(id int64) {
			if _, err := db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				t.Fatal(err)
			}
		})
	var my *mysql.MySQLError
	switch {
	case err == nil:
		t.Fatal("the Claim whose connection was killed succeeded")
	case errors.As(err, &my) && my.Number == 1927:
		errtest.Wraps(t, "Claim whose connection was killed (1927)", err, stores.ErrUnavailable)
	case errors.Is(err, stores.ErrUnavailable):
		t.Fatalf("Claim whose connection was killed, the database serving: %v, an outage", err)
	}
}

// TestMySQLServerRefusals: on a MariaDB of the test's own, a server that
// turned read-only (the old primary after a failover: 1290) and one out
// of connections (1040) are outages; a user at a limit its administrator
// set (1226: MAX_USER_CONNECTIONS, MAX_CONNECTIONS_PER_HOUR) is refused,
// and a fail-open consumer runs no handler.
func TestMySQLServerRefusals(t *testing.T) {
	srv := startMariaDB(t)
	root := srv.open(t, "test")
	ctx := context.Background()
	for _, stmt := range []string{
		"CREATE USER app IDENTIFIED BY 'app'", "GRANT ALL ON test.* TO app",
		"CREATE USER solo IDENTIFIED BY 'solo' WITH MAX_USER_CONNECTIONS 1", "GRANT ALL ON test.* TO solo",
		"CREATE USER hourly IDENTIFIED BY 'hourly' WITH MAX_CONNECTIONS_PER_HOUR 1", "GRANT ALL ON test.* TO hourly",
	} {
		if _, err := root.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	openAs := func(user string) *sql.DB {
		cfg := srv.dsn("test", nil)
		db, err := sql.Open("mysql", user+":"+user+cfg[len("root"):])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	app := openAs("app")
	s := sqltest.NewStore(t, app, sqlstore.MySQL, sqlstore.Config{})
	if _, err := s.Claim(ctx, "s", []string{"before"}, time.Minute); err != nil {
		t.Fatal(err)
	}

	t.Run("read-only", func(t *testing.T) {
		if _, err := root.ExecContext(ctx, "SET GLOBAL read_only = 1"); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = root.ExecContext(ctx, "SET GLOBAL read_only = 0") }()
		_, err := s.Claim(ctx, "s", []string{"ro"}, time.Minute)
		errtest.Wraps(t, "Claim on a read-only server", err, stores.ErrUnavailable)
	})

	t.Run("max_connections", func(t *testing.T) {
		// MariaDB's least max_connections is 10: hold that many.
		if _, err := root.ExecContext(ctx, "SET GLOBAL max_connections = 10"); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = root.ExecContext(ctx, "SET GLOBAL max_connections = 151") }()
		hold := openAs("app")
		for range 10 {
			c, err := hold.Conn(ctx)
			if err != nil {
				break // full already
			}
			defer c.Close()
		}
		fresh := openAs("app") // no idle connection to reuse
		s := newStoreOn(t, fresh, s.Table())
		_, err := s.Claim(ctx, "s", []string{"full"}, time.Minute)
		errtest.Wraps(t, "Claim on a server out of connections", err, stores.ErrUnavailable)
	})

	t.Run("max_user_connections", func(t *testing.T) {
		solo := openAs("solo")
		conn, err := solo.Conn(ctx) // its one connection
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		s := newStoreOn(t, solo, s.Table())
		_, err = s.Claim(ctx, "s", []string{"solo"}, time.Minute)
		errtest.Wraps(t, "Claim of a user at its connection limit", err, sqlstore.ErrRefused)
		if ran, err := testkit.FailOpenRun(t, s, 3); ran != 0 || err == nil {
			t.Fatalf("FailOpen, a user at its connection limit: %d of 3 handlers ran unprotected, last error %v", ran, err)
		}
	})

	t.Run("max_connections_per_hour", func(t *testing.T) {
		hourly := openAs("hourly")
		s := newStoreOn(t, hourly, s.Table())
		if _, err := s.Claim(ctx, "s", []string{"hourly"}, time.Minute); err != nil {
			t.Fatalf("the hour's one connection: %v", err)
		}
		hourly.SetMaxIdleConns(0) // every call on a new connection from now on
		_, err := s.Claim(ctx, "s", []string{"hourly-2"}, time.Minute)
		errtest.Wraps(t, "Claim of a user past its connections per hour", err, sqlstore.ErrRefused)
		if ran, err := testkit.FailOpenRun(t, s, 3); ran != 0 || err == nil {
			t.Fatalf("FailOpen, a user past its connections per hour: %d of 3 handlers ran unprotected, last error %v", ran, err)
		}
	})
}

// newStoreOn returns a store over db on an existing table.
func newStoreOn(t *testing.T, db *sql.DB, table string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// TestConfirmationNeverWaitsForTheCallersConnection: a broken connection
// is confirmed as an outage by a call on another connection of the pool
// (see the README's Errors section). With the pool at its limit, that
// call must not wait for a connection the caller itself holds: the
// database goes down (the proxy cut: connections closed, new dials
// refused) under a pool of one connection, held by the caller.
//
//   - An inbox transaction's Commit with data: its statement fails on the
//     broken connection; the transaction is ended (its connection given
//     back) before the confirmation, which finds the database down.
//   - A Begin joined to the application's own transaction (sqlstore.WithTx),
//     which keeps the only connection: no other is free to confirm with,
//     and the call returns at once, no known outage, rather than wait.
//
// The calls run under contexts without a deadline: nothing but the
// store's own rule ends them.
func TestConfirmationNeverWaitsForTheCallersConnection(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		t.Run("inbox commit", func(t *testing.T) {
			s, db, p := proxiedStore(t, b, sqlstore.Config{})
			db.SetMaxOpenConns(1)
			bg := context.Background()
			itx, err := s.Begin(bg, "s", []string{"k"}, time.Hour)
			if err != nil || itx.Result() != stores.Claimed {
				t.Fatalf("Begin = %v, %v", itx, err)
			}
			p.Cut()
			within(t, "Commit on a database gone down, its transaction holding the pool's only connection", time.Minute, func() {
				err = itx.Commit(bg, []byte("data"))
			})
			if !errors.Is(err, stores.ErrUnavailable) {
				t.Fatalf("Commit on a database gone down = %v, want ErrUnavailable", err)
			}
		})
		t.Run("joined begin", func(t *testing.T) {
			s, db, p := proxiedStore(t, b, sqlstore.Config{})
			db.SetMaxOpenConns(1)
			bg := context.Background()
			if _, err := s.Claim(bg, "s", []string{"first"}, time.Minute); err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(bg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(bg, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			p.Cut()
			within(t, "a joined Begin on a database gone down, the application's transaction holding the pool's only connection", time.Minute, func() {
				_, err = s.Begin(sqlstore.WithTx(bg, tx), "s", []string{"j"}, time.Hour)
			})
			if err == nil {
				t.Fatal("a joined Begin on a database gone down succeeded")
			}
			t.Logf("joined Begin: %v", err)
		})
	})
}
