package sqlstore_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"
	_ "github.com/mattn/go-sqlite3" // the cgo SQLite driver, "sqlite3": tests only

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// driverOption is one driver or server setting users run the store
// under: open returns a database with it, closed after t.
type driverOption struct {
	name    string
	dialect sqlstore.Dialect
	open    func(t *testing.T) *sql.DB
}

// driverOptions is the matrix of TestDriverOptions. Each row changes one
// thing from the driver's defaults (the last MySQL row combines the
// usual production DSN); the default settings themselves run in
// TestConformance and TestInboxConformance.
var driverOptions = []driverOption{
	{"mysql/parseTime=true", sqlstore.MySQL, mysqlOption(func(c *mysql.Config) { c.ParseTime = true })},
	{"mysql/clientFoundRows=true", sqlstore.MySQL, mysqlOption(func(c *mysql.Config) { c.ClientFoundRows = true })},
	{"mysql/interpolateParams=true", sqlstore.MySQL, mysqlOption(func(c *mysql.Config) { c.InterpolateParams = true })},
	{"mysql/isolation=READ-COMMITTED", sqlstore.MySQL, mysqlIsolation("READ-COMMITTED")},
	{"mysql/isolation=SERIALIZABLE", sqlstore.MySQL, mysqlIsolation("SERIALIZABLE")},
	{"mysql/all", sqlstore.MySQL, mysqlOption(func(c *mysql.Config) {
		c.ParseTime, c.ClientFoundRows, c.InterpolateParams = true, true, true
	})},
	// simple_protocol is what PgBouncer in transaction mode needs (no
	// prepared statements survive a transaction).
	{"postgres/default_query_exec_mode=simple_protocol", sqlstore.Postgres, pgxExecMode("simple_protocol")},
	{"postgres/default_query_exec_mode=exec", sqlstore.Postgres, pgxExecMode("exec")},
	{"postgres/default_query_exec_mode=cache_describe", sqlstore.Postgres, pgxExecMode("cache_describe")},
	// modernc.org/sqlite with its own pragma syntax, as its docs show,
	// rather than sqlstore.SQLiteDSN's.
	{"sqlite/modernc/_pragma", sqlstore.SQLite, sqliteWith("sqlite", func(path string) string {
		return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	})},
	// github.com/mattn/go-sqlite3 (cgo) with sqlstore.SQLiteDSN, whose
	// parameters it reads too.
	{"sqlite/mattn", sqlstore.SQLite, sqliteWith("sqlite3", sqlstore.SQLiteDSN)},
	// The DSN mattn/go-sqlite3 users usually write: WAL and a busy
	// timeout, but deferred transactions (no _txlock=immediate), whose
	// read-then-write upgrades fail with SQLITE_BUSY at once under
	// contention, without waiting: the store's own transactions take
	// the write lock first (TestSQLiteDeferredTransactions).
	{"sqlite/mattn/_journal_mode=WAL&_busy_timeout=5000", sqlstore.SQLite, sqliteWith("sqlite3", func(path string) string {
		return "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000"
	})},
}

// TestDriverOptions runs the Store and the Inbox conformance suites on
// the SQL store under every row of driverOptions.
func TestDriverOptions(t *testing.T) {
	for _, o := range driverOptions {
		t.Run(o.name, func(t *testing.T) {
			db := o.open(t)
			t.Run("Store", func(t *testing.T) {
				storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
					return sqltest.NewStore(t, db, o.dialect, sqlstore.Config{Clock: clock})
				}, storetest.AdminNoScopes())
			})
			t.Run("Inbox", func(t *testing.T) {
				storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
					return sqltest.NewInboxFixture(t, db, o.dialect, sqlstore.Config{Clock: clock})
				})
			})
		})
	}
}

// openOption opens driver's dsn for one row of the matrix, with the pool
// the shared test databases have, and closes it after t.
func openOption(t *testing.T, driver, dsn, service, addr string) *sql.DB {
	t.Helper()
	db := sqltest.OpenPool(t, driver, dsn, service, addr)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// mysqlOption opens the test MySQL/MariaDB with the driver's defaults
// for the options of the matrix, then set applied.
func mysqlOption(set func(c *mysql.Config)) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB {
		t.Helper()
		cfg, err := mysql.ParseDSN(testkit.RequireMySQL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ParseTime, cfg.ClientFoundRows, cfg.InterpolateParams = false, false, false
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		delete(cfg.Params, "transaction_isolation")
		delete(cfg.Params, "tx_isolation")
		set(cfg)
		return openOption(t, "mysql", cfg.FormatDSN(), "MySQL/MariaDB", cfg.Addr)
	}
}

// mysqlIsolation sets the session's default isolation level through the
// DSN's system variables: transaction_isolation on MySQL 8 and MariaDB
// 11.1 and later, tx_isolation before (the DSN
// transaction_isolation=%27SERIALIZABLE%27, say). The store's own
// transactions ask for READ COMMITTED; the level applies to its
// autocommit statements and to the caller's transactions Begin joins.
func mysqlIsolation(level string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB {
		t.Helper()
		variable := "tx_isolation"
		var name, value string
		err := sqltest.OpenMySQL(t).QueryRowContext(context.Background(), "SHOW VARIABLES LIKE 'transaction_isolation'").Scan(&name, &value)
		switch {
		case err == nil:
			variable = "transaction_isolation"
		case err != sql.ErrNoRows:
			t.Fatal(err)
		}
		db := mysqlOption(func(c *mysql.Config) { c.Params[variable] = "'" + level + "'" })(t)
		var got string
		if err := db.QueryRowContext(context.Background(), "SELECT @@"+variable).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != level {
			t.Fatalf("@@%s = %s, want %s: the DSN did not set it", variable, got, level)
		}
		return db
	}
}

// pgxExecMode opens the test PostgreSQL through pgx with the given
// default_query_exec_mode.
func pgxExecMode(mode string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB {
		t.Helper()
		u, err := url.Parse(testkit.RequirePostgres(t))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
		return openOption(t, "pgx", u.String(), "PostgreSQL", u.Host)
	}
}

// sqliteWith opens a fresh SQLite file through driver, with the DSN dsn
// makes of its path.
func sqliteWith(driver string, dsn func(path string) string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB {
		t.Helper()
		path := filepath.Join(t.TempDir(), "dedup.db")
		db := openOption(t, driver, dsn(path), "SQLite", path)
		db.SetMaxOpenConns(8) // as openSQLite: one writer at a time
		return db
	}
}
