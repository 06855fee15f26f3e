package sqlstore_test

import (
	"database/sql"
	"path/filepath"
	"slices"
	"testing"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver, "sqlite"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// backends are the dialects the tests here run on: the servers and
// SQLite, on a fresh file of each test's own.
var backends = append(slices.Clone(sqltest.Servers), sqltest.Backend{Dialect: sqlstore.SQLite, Open: openSQLite})

// serverBackends are the backends behind a network connection.
var serverBackends = sqltest.Servers

// sqliteBackends is SQLite alone, for the suites stores/sqlstore runs on
// the servers.
var sqliteBackends = backends[2:]

// openSQLite opens a fresh SQLite file in t.TempDir(), closed with t.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "dedup.db")))
	if err != nil {
		t.Fatal(err)
	}
	// One writer at a time: more connections only busy-wait for the lock
	// (see stores/sqlstore/README.md).
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
