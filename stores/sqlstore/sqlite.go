package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"strings"
	"sync"
	"time"
)

// SQLite: the DSN the store needs, a state column, ids as BLOB, unix
// microseconds, a database-wide write lock instead of row locks, batches
// as one transaction (one WAL sync), error codes read from two drivers.

// MaxDataSQLite is the default and largest Config.MaxData on SQLite:
// SQLITE_MAX_LENGTH (10^9 in both drivers' builds) bounds a row, less 1
// KiB for its other columns.
const MaxDataSQLite = 1_000_000_000 - 1<<10

// SQLiteDSN returns a modernc.org/sqlite data source name for the database
// file at path with the settings the store needs under concurrency: a busy
// timeout (writers wait for the database lock instead of failing with
// SQLITE_BUSY), WAL journaling (readers do not block the writer) and
// BEGIN IMMEDIATE transactions (a handler that reads before it writes
// cannot fail to upgrade its lock). synchronous stays FULL: a commit the
// broker was acked for must survive a power cut.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
}

// sqliteInfo describes SQLite to New, Validate and DetectDialect.
var sqliteInfo = dialectInfo{
	maxData:  MaxDataSQLite,
	drivers:  []string{"sqlite"},
	noSchema: true,
	open: func(table string, _ bool, db *sql.DB) dialect {
		// Asked at the first Begin: New does no I/O and asks nothing
		// of db.
		return newSQLite(table, sync.OnceValue(func() bool {
			return strings.Contains(driverPkg(db), "mattn/go-sqlite3")
		}))
	},
}

type sqliteDialect struct {
	base
	q     statements
	name  string
	mattn func() bool // the driver is github.com/mattn/go-sqlite3
}

var _ dialect = (*sqliteDialect)(nil)

func newSQLite(table string, mattn func() bool) *sqliteDialect {
	d := &sqliteDialect{name: table, mattn: mattn}
	q := &d.q
	q.table = `"` + table + `"`
	q.ph = func(int) string { return "?" }
	q.setState = func(st int) string { return fmt.Sprintf("state = %d, ", st) }
	q.forUpdate = "" // the write lock taken by the first INSERT already serialises
	q.selectFrom = "SELECT id, state, CASE WHEN expires_at > ? THEN 1 ELSE 0 END, data, token FROM " + q.table
	q.setDataTable = q.table
	ins := "INSERT INTO " + q.table + " (id, state, token, expires_at) " +
		"VALUES (?, %d, %s, ?) ON CONFLICT (id) DO NOTHING"
	q.insertProcessing = "INSERT INTO " + q.table + " (id, state, token, expires_at, data) " +
		"VALUES (?, " + fmt.Sprint(stateProcessing) + ", ?, ?, ?) ON CONFLICT (id) DO NOTHING"
	q.insertDone = fmt.Sprintf(ins, stateDone, "NULL")
	return d
}

func (d *sqliteDialect) sql() *statements { return &d.q }

func (d *sqliteDialect) schema() []string {
	return []string{
		"CREATE TABLE IF NOT EXISTS " + d.q.table + " (\n" +
			"    id         BLOB    NOT NULL PRIMARY KEY,\n" +
			"    state      INTEGER NOT NULL,\n" +
			"    token      INTEGER,\n" +
			"    expires_at INTEGER NOT NULL,\n" +
			"    data       BLOB\n" +
			") WITHOUT ROWID",
		`CREATE INDEX IF NOT EXISTS "` + d.name + `_expires_idx" ON ` + d.q.table + ` (expires_at)`,
	}
}

func (d *sqliteDialect) idArg(id recordID) any { return id[:] }

// timeArg is unix microseconds: time zone free.
func (d *sqliteDialect) timeArg(t time.Time) any { return roundUp(t).UnixMicro() }

func (d *sqliteDialect) inserted(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	return n == 1, err
}

// quirks: the store's transactions take the driver's default (BEGIN
// IMMEDIATE with SQLiteDSN), and each takes the write lock with its
// first statement whatever that default is (a DSN of deferred
// transactions): a write, or in those that read first (Store.inTx) a
// DELETE that matches nothing (quirks.lockFirst), which SQLite begins as
// a write, waiting for the lock up to its busy timeout.
// mattn/go-sqlite3 waits for the write lock without watching the
// context.
func (d *sqliteDialect) quirks() quirks {
	return quirks{lockWaitIgnoresContext: d.mattn, lockFirst: "DELETE FROM " + d.q.table + " WHERE 0"}
}

func (d *sqliteDialect) classify(err error) errClass {
	code, ok := sqliteCode(err)
	if !ok {
		return 0
	}
	switch code & 0xff {
	case 5, 6: // BUSY, LOCKED: still locked by another writer (after the retries)
		return errUnavailable | errRetryable
	case 10, 13: // IOERR, FULL
		return errUnavailable
	case 18: // TOOBIG: a string or blob over SQLITE_MAX_LENGTH
		return errTooLarge
	}
	// CANTOPEN is not known to be an outage: a path (a directory that
	// does not exist) or a permission to fix.
	return 0
}

func (d *sqliteDialect) purgePlan(context.Context, *sql.DB, int64) (string, iter.Seq[[]any], error) {
	return fmt.Sprintf("DELETE FROM %s WHERE id IN (SELECT id FROM %s WHERE %s LIMIT ?)", d.q.table, d.q.table,
		purgePredicate(fmt.Sprintf("state = %d", stateDone), "?", "?")), one, nil
}

// adminSyntax: the id as 16 bytes, the state column, unix microseconds.
func (d *sqliteDialect) adminSyntax() adminSyntax {
	return adminSyntax{id: "id", state: "state", micros: func(expr string) string { return expr }}
}

// sqliteTableSize sums the pages of the table and its index, from the dbstat
// virtual table (modernc.org/sqlite has it; a SQLite built without
// SQLITE_ENABLE_DBSTAT_VTAB fails). Args: the table's and the index's
// names.
const sqliteTableSize = "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN (?, ?)"

func (d *sqliteDialect) tableBytes(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, sqliteTableSize, d.name, d.name+"_expires_idx").Scan(&n)
	return n, err
}

// execBatch runs a batch in one transaction of the calls' own single-row
// statements: they cost no round trip (SQLite runs in process) while
// each commit syncs the WAL to disk.
func (d *sqliteDialect) execBatch(ctx context.Context, db *sql.DB, ops []*op, now time.Time) error {
	return execInTx(ctx, db, d, ops, now, "")
}

// sqliteCode returns the (extended) result code of a SQLite error in err's
// tree: modernc.org/sqlite's errors have a Code() int method,
// github.com/mattn/go-sqlite3's sqlite3.Error has a Code field (the
// package is not imported: it needs cgo).
func sqliteCode(err error) (int, bool) {
	var coder interface{ Code() int }
	if errors.As(err, &coder) {
		return coder.Code(), true
	}
	found, code := false, 0
	walkErrors(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || !strings.Contains(v.Type().PkgPath(), "mattn/go-sqlite3") {
			return false
		}
		f := v.FieldByName("Code")
		if !f.IsValid() || !f.CanInt() {
			return false
		}
		found, code = true, int(f.Int())
		return true
	})
	return code, found
}

// walkErrors calls fn on err and every error it wraps, depth first, until
// fn returns true.
func walkErrors(err error, fn func(error) bool) bool {
	for err != nil {
		if fn(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walkErrors(e, fn) {
					return true
				}
			}
			return false
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return false
		}
	}
	return false
}
