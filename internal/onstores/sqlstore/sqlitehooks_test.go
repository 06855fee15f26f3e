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

// sqliteHooks watches, through mattn/go-sqlite3's authorizer, the
// statements that connections of one database prepare, and can hold or
// refuse them: what sqlstore's own tests do with the store's batch hook,
// which tests outside the package cannot reach. The authorizer runs when
// a statement is prepared, before it takes any lock, and sqlstore
// prepares each statement where it runs it.
type sqliteHooks struct {
	// table is the store's table: writes on others are not watched.
	table atomic.Value // string
	// onWrite, when set, sees each statement that inserts, updates or
	// deletes rows of table, with whether its connection is in a
	// transaction and how many such statements that transaction has
	// prepared before it; it returns what the authorizer answers
	// (sqlite3.SQLITE_OK, or SQLITE_DENY to fail the statement).
	onWrite atomic.Pointer[func(inTx bool, before int) int]
	// deletes counts the statements that delete rows of table.
	deletes atomic.Int64

	mu sync.Mutex
	// txWrites is the number of writes of each transaction that
	// committed, in the order they did.
	txWrites []int
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
	inTx, writes := false, 0 // the connection's: used by one goroutine at a time
	c.RegisterAuthorizer(func(op int, arg1, _, _ string) int {
		switch op {
		case sqlite3.SQLITE_TRANSACTION:
			switch arg1 {
			case "BEGIN":
				inTx, writes = true, 0
			case "COMMIT":
				h.mu.Lock()
				h.txWrites = append(h.txWrites, writes)
				h.mu.Unlock()
				inTx = false
			case "ROLLBACK":
				inTx = false
			}
		case sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE:
			if arg1 != h.table.Load() {
				break
			}
			if op == sqlite3.SQLITE_DELETE {
				h.deletes.Add(1)
			}
			answer := sqlite3.SQLITE_OK
			if f := h.onWrite.Load(); f != nil {
				answer = (*f)(inTx, writes)
			}
			if inTx {
				writes++
			}
			return answer
		}
		return sqlite3.SQLITE_OK
	})
}

// transactions returns the writes of each transaction committed so far.
func (h *sqliteHooks) transactions() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.txWrites...)
}
