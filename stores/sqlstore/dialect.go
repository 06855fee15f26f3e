package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"iter"
	"reflect"
	"strings"
	"time"
)

// The dialect interface the Store calls, what each dialect describes of
// itself (dialectInfo, quirks, syntax, adminSyntax), and the statement
// builder that makes the generic SQL from a dialect's syntax.

// dialect is a SQL flavour as the store uses it. postgres.go, mysql.go
// and sqlite.go each implement it, and each holds everything that differs
// between databases: its SQL text, its batch executor, its error
// classification and its quirks. The rest of the package calls this
// interface and never asks which dialect it has, as database/sql never
// asks which driver it has. A dialect is handed what it works on (a
// *sql.DB, a transaction, the ops of a batch); it never calls back into
// the Store.
type dialect interface {
	// sql returns the statements on the store's table.
	sql() *statements
	// schema returns the DDL of the table, one idempotent statement per
	// element (README.md shows the same text).
	schema() []string
	// idArg and timeArg are the query arguments for a record id and an
	// instant (at the database's microsecond, rounded up: see roundUp).
	idArg(id recordID) any
	timeArg(t time.Time) any
	// inserted reports whether a single-row INSERT with the dialect's
	// on-conflict clause inserted its row (false: the id existed).
	inserted(res sql.Result) (bool, error)

	// execBatch runs ops, two or more single-key lease-mode calls on
	// distinct ids in ascending id order, as one batch: it decides each
	// op (see op) or fails as a whole, having then changed nothing, or
	// with an unknown outcome after a broken connection.
	execBatch(ctx context.Context, db *sql.DB, ops []*op, now time.Time) error

	// classify tells which of the classes the store acts on an error
	// belongs to.
	classify(err error) errClass

	// quirks are the ways the dialect's server or driver departs from
	// what the generic code would otherwise assume.
	quirks() quirks
	// checkSession checks, once per store, that the database session
	// settings suit the store (see ErrSessionSettings), and returns the
	// most data the server takes in a statement (0: no limit below the
	// dialect's maxData).
	checkSession(ctx context.Context, db *sql.DB) (dataLimit int, err error)
	// joinCheck runs, right after Begin set savepoint sp in a transaction
	// it joins, the checks the dialect needs before writing there.
	joinCheck(ctx context.Context, tx *sql.Tx, sp string) error
	// purgePlan returns the statement that deletes expired records
	// (args: now, graceCutoff, limit, then a range's own arguments) and
	// the ranges to run it over, each until a statement deletes fewer
	// than limit records. chunk is the size of a range, where the
	// dialect has ranges.
	purgePlan(ctx context.Context, db *sql.DB, chunk int64) (string, iter.Seq[[]any], error)

	// adminSyntax tells the admin statements (admin.go) how to read the
	// columns.
	adminSyntax() adminSyntax
	// tableBytes returns the space the table and its indexes take, as
	// the database reports it.
	tableBytes(ctx context.Context, db *sql.DB) (int64, error)
}

// partitioner is implemented by a dialect that can keep the table in
// daily partitions of expires_at (PostgreSQL; Config.DailyPartitions).
type partitioner interface {
	// lockIDs takes, in tx, the locks that keep ids unique across
	// partitions. Every claim and Begin takes them before it reads or
	// inserts.
	lockIDs(ctx context.Context, tx *sql.Tx, ids []recordID) error
	// createPartitions creates the partitions from the day before today
	// to daysAhead+1 days after it that do not exist yet, but for those
	// whose day ended before cutoff (dropPartitions would drop them).
	createPartitions(ctx context.Context, db *sql.DB, today time.Time, daysAhead int, cutoff time.Time) error
	// dropPartitions drops every partition whose day ended before cutoff,
	// and reports each one's estimated row count to dropped.
	dropPartitions(ctx context.Context, db *sql.DB, cutoff time.Time, dropped func(rows int64)) (int64, error)
}

// dialectInfo describes a dialect to New, Validate and DetectDialect.
type dialectInfo struct {
	// drivers are substrings of the package paths of its drivers.
	drivers []string
	// noSchema: the table name takes no schema prefix.
	noSchema bool
	// partitions: the dialect is a partitioner (Config.DailyPartitions).
	partitions bool
	// maxData is the most bytes of data the dialect keeps and carries
	// in a statement: the default and the bound of Config.MaxData.
	maxData int
	// open returns the dialect for a table (validated) and layout; db is
	// only asked about its driver, never used.
	open func(table string, partitioned bool, db *sql.DB) dialect
}

// driverPkg is the package path of db's driver.
func driverPkg(db *sql.DB) string {
	t := reflect.TypeOf(db.Driver())
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// adminSyntax is what a dialect tells the admin statements.
type adminSyntax struct {
	// id reads the id column: 16 bytes, or the UUID as text.
	id string
	// state is a record's state: stateProcessing or stateDone.
	state string
	// micros turns a timestamp expression (expires_at, an aggregate of
	// it) into unix microseconds, a bigint.
	micros func(expr string) string
}

// quirks are a dialect's departures from the generic code's defaults.
type quirks struct {
	// txOptions are the options of the store's own transactions.
	txOptions *sql.TxOptions
	// noopUpdateMatchesNothing: an UPDATE that leaves a row as it was
	// reports 0 rows affected (MySQL without CLIENT_FOUND_ROWS), so a
	// fenced Extend to the same instant must count its rows instead.
	noopUpdateMatchesNothing bool
	// endIgnoresContext: the driver's Commit and Rollback wait for the
	// server whatever the transaction's context (go-sql-driver/mysql),
	// so the store waits for them in a goroutine of its own.
	endIgnoresContext bool
	// lockWaitIgnoresContext reports that the driver waits for the
	// database's lock without watching the statement's context
	// (mattn/go-sqlite3), so Begin waits for it in a goroutine of its
	// own. nil means never.
	lockWaitIgnoresContext func() bool
	// lockFirst, when set, is the first statement of each transaction
	// of the store's own that may read before it writes (Store.inTx;
	// those that write first use Store.inWriteTx): it takes the
	// database's write lock, waiting for it as any write does, before
	// the transaction reads. SQLite
	// with deferred transactions (a DSN without _txlock=immediate) needs
	// it: a transaction that has read cannot upgrade its lock once
	// another writer has committed since, and SQLite answers SQLITE_BUSY
	// at once, without its busy timeout, as often as it is retried.
	lockFirst string
}

// base gives a dialect the defaults of the optional behaviours.
type base struct{}

func (base) quirks() quirks { return quirks{} }

func (base) checkSession(context.Context, *sql.DB) (int, error) { return 0, nil }

func (base) joinCheck(context.Context, *sql.Tx, string) error { return nil }

// splitTable returns the schema ("" when none) and the table part of a
// validated table name.
func splitTable(table string) (schema, name string) {
	if i := strings.IndexByte(table, '.'); i >= 0 {
		return table[:i], table[i+1:]
	}
	return "", table
}

// Record states: the state column on MySQL and SQLite; on PostgreSQL,
// which has no such column, a record is processing while it has a token
// and done once its token is NULL (see postgres.go).
const (
	stateProcessing = 1
	stateDone       = 2
)

// syntax is what a dialect tells the shared statement builder.
type syntax struct {
	table string // quoted, possibly schema-qualified
	// ph is the i-th (1-based) placeholder.
	ph func(i int) string
	// setState is the SET clause part that stores state st ("" where the
	// token stores it).
	setState func(st int) string
	// forUpdate locks the rows a SELECT reads ("" where a transaction's
	// first write already serialises).
	forUpdate string
	// selectFrom is the start of a read of records, up to "WHERE": id (as
	// idArg gives it), state, live (1 or 0 at the first placeholder),
	// data and token.
	selectFrom string
	// setDataTable is the table as setData names it.
	setDataTable string
	// insertProcessing (id, token, expires, owner) and insertDone (id,
	// expires) insert one record, leaving an existing one unchanged (but
	// on the partitioned layout, which inserts under a lock). A
	// processing record keeps its claim's owner (stores.OwnerClaimer) in
	// the data column, which only a done record's data uses otherwise.
	insertProcessing, insertDone string
}

// statements builds the SQL the generic code runs, from a dialect's
// syntax.
type statements struct{ syntax }

// list is "(p_from, ..., p_from+n-1)".
func (q *statements) list(from, n int) string {
	var b strings.Builder
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(q.ph(from + i))
	}
	b.WriteByte(')')
	return b.String()
}

// selectRows reads the records of n ids: id, state, live (1 or 0), data
// and token. Args: now, ids...
func (q *statements) selectRows(n int, lock bool) string {
	s := q.selectFrom + " WHERE id IN " + q.list(2, n)
	if lock {
		s += q.lockInIDOrder()
	}
	return s
}

// lockInIDOrder ends a SELECT that locks the rows it reads so that it
// takes their locks in ascending id order: the order of every other
// statement and transaction that locks several records (acquire's one
// id after the other, the sorted batches), so none of them can wait on
// another in a cycle. PostgreSQL otherwise locks in the order its plan
// reads the rows, which is heap order for a bitmap or sequential scan.
func (q *statements) lockInIDOrder() string {
	if q.forUpdate == "" {
		return ""
	}
	return " ORDER BY id" + q.forUpdate
}

// takeover turns n expired records into processing records of a new
// claim, keeping its owner. Args: token, expires, owner, ids...
func (q *statements) takeover(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = %s, expires_at = %s, data = %s WHERE id IN %s",
		q.table, q.setState(stateProcessing), q.ph(1), q.ph(2), q.ph(3), q.list(4, n))
}

// replaceDone turns n expired records into done records of an inbox
// transaction. Args: expires, ids...
func (q *statements) replaceDone(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = NULL, expires_at = %s, data = NULL WHERE id IN %s",
		q.table, q.setState(stateDone), q.ph(1), q.list(2, n))
}

// setData stores data on n records an inbox transaction inserted, which
// expire at expires. Args: data, expires, ids...
func (q *statements) setData(n int) string {
	return fmt.Sprintf("UPDATE %s SET data = %s WHERE expires_at = %s AND id IN %s", q.setDataTable, q.ph(1), q.ph(2), q.list(3, n))
}

// complete: args expires, data, token, ids...
func (q *statements) complete(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = NULL, expires_at = %s, data = %s WHERE token = %s AND id IN %s",
		q.table, q.setState(stateDone), q.ph(1), q.ph(2), q.ph(3), q.list(4, n))
}

// extend: args expires, token, ids...
func (q *statements) extend(n int) string {
	return fmt.Sprintf("UPDATE %s SET expires_at = %s WHERE token = %s AND id IN %s",
		q.table, q.ph(1), q.ph(2), q.list(3, n))
}

// release: args token, ids...
func (q *statements) release(n int) string {
	return fmt.Sprintf("DELETE FROM %s WHERE token = %s AND id IN %s", q.table, q.ph(1), q.list(2, n))
}

// owned counts the records of n ids still owned by a token, locking them.
// Args: token, ids...
func (q *statements) owned(n int, lock bool) string {
	s := fmt.Sprintf("SELECT id FROM %s WHERE token = %s AND id IN %s", q.table, q.ph(1), q.list(2, n))
	if lock {
		s += q.lockInIDOrder()
	}
	return s
}

// purgePredicate is true for the records a purge deletes: done records
// whose retention ended before now, processing records whose lease ended
// before graceCutoff (the placeholders).
func purgePredicate(isDone, now, graceCutoff string) string {
	return fmt.Sprintf("expires_at < %s AND (%s OR expires_at < %s)", now, isDone, graceCutoff)
}

// one is a purge plan's single range, without arguments of its own.
func one(yield func([]any) bool) { yield(nil) }

// roundUp rounds t up to the database's microsecond, so that an expiry
// computed as now (already truncated, see Store.now) plus a duration
// never loses a lease or retention shorter than a microsecond, or a
// fraction of one.
func roundUp(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		return r.Add(time.Microsecond)
	}
	return t
}
