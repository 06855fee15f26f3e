package sqlstore_test

import (
	"database/sql"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mattn/go-sqlite3"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// sqliteHooks watches, through mattn/go-sqlite3's authorizer, the writes
// that connections of one database prepare on the store's table, and can
// hold or refuse them: what sqlstore's own tests do with the store's batch
// hook, which tests outside the package cannot reach. sqlstore prepares
// each statement where it runs it, so the authorizer sees every run. It
// is called when a statement is prepared, before the statement takes any
// lock, and again when SQLite prepares it anew at its first step (a
// statement whose plan depends on a bound value: a LIMIT ?); an UPDATE
// calls it once for each column it sets. So the calls are not
// statements: a write is counted by the calls' kinds (an INSERT, one
// call, is one claim).
type sqliteHooks struct {
	// table is the store's table: writes on others are not watched.
	table atomic.Value // string
	// onWrite, when set, sees each authorizer call for a write on table
	// (op: sqlite3.SQLITE_INSERT, _UPDATE or _DELETE), with whether its
	// connection is in a transaction and how many such calls that
	// transaction made before it; it returns what the authorizer
	// answers (sqlite3.SQLITE_OK, or SQLITE_DENY to fail the statement).
	onWrite atomic.Pointer[func(op int, inTx bool, before int) int]

	mu sync.Mutex
	// txInserts is the number of INSERTs on table (claims) of each
	// transaction whose COMMIT was prepared, in that order.
	txInserts []int
}

// sqliteWithHooks opens a SQLite database in a file of the test's with
// sqlstore.SQLiteDSN (or dsn[0]) on mattn/go-sqlite3 whose connections
// report to h (through a driver registered for it alone), closed after t;
// it returns the file's path too.
func sqliteWithHooks(t *testing.T, h *sqliteHooks, dsn ...func(path string) string) (*sql.DB, string) {
	t.Helper()
	name := "sqlite3-hooks-" + storetest.NewID()
	sql.Register(name, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		h.watch(c)
		return nil
	}})
	path := filepath.Join(t.TempDir(), "dedup.db")
	open := sqlstore.SQLiteDSN
	if len(dsn) > 0 {
		open = dsn[0]
	}
	db := openOption(t, name, open(path), "SQLite", path)
	db.SetMaxOpenConns(8)
	return db, path
}

// watch sets the authorizer of one connection.
func (h *sqliteHooks) watch(c *sqlite3.SQLiteConn) {
	// The connection's own: used by one goroutine at a time.
	inTx, calls, inserts := false, 0, 0
	c.RegisterAuthorizer(func(op int, arg1, _, _ string) int {
		switch op {
		case sqlite3.SQLITE_TRANSACTION:
			switch arg1 {
			case "BEGIN":
				inTx, calls, inserts = true, 0, 0
			case "COMMIT":
				h.mu.Lock()
				h.txInserts = append(h.txInserts, inserts)
				h.mu.Unlock()
				inTx = false
			case "ROLLBACK":
				inTx = false
			}
		case sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE:
			if arg1 != h.table.Load() {
				break
			}
			answer := sqlite3.SQLITE_OK
			if f := h.onWrite.Load(); f != nil {
				answer = (*f)(op, inTx, calls)
			}
			if inTx {
				calls++
				if op == sqlite3.SQLITE_INSERT {
					inserts++
				}
			}
			return answer
		}
		return sqlite3.SQLITE_OK
	})
}

// claimsPerTransaction returns the claims (INSERTs) of each transaction
// committed so far.
func (h *sqliteHooks) claimsPerTransaction() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.txInserts...)
}
