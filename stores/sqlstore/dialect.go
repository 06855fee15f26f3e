package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/dedup/stores"
)

// Dialect names the SQL flavour of the database behind a Store.
type Dialect string

// The supported dialects.
const (
	// Postgres is PostgreSQL 11 or later, through
	// github.com/jackc/pgx/v5/stdlib (or any driver returning errors with a
	// SQLState() method, such as lib/pq).
	Postgres Dialect = "postgres"
	// MySQL is MySQL 8 or MariaDB 10.5 or later, through
	// github.com/go-sql-driver/mysql.
	MySQL Dialect = "mysql"
	// SQLite is SQLite 3.35 or later, through modernc.org/sqlite (no cgo)
	// or github.com/mattn/go-sqlite3. The latter waits for the database's
	// write lock for its DSN's _busy_timeout whatever the statement's
	// context: Begin is bounded by its context all the same (its
	// statements run in a goroutine it stops waiting for), lease-mode
	// calls only by that busy timeout.
	SQLite Dialect = "sqlite"
)

// Record states: the state column on MySQL and SQLite; on PostgreSQL,
// which has no such column, a record is processing while it has a token
// and done once its token is NULL (see queries.stateExpr).
const (
	stateProcessing = 1
	stateDone       = 2
)

// DetectDialect returns the dialect of db's driver: pgx or lib/pq are
// Postgres, go-sql-driver/mysql is MySQL, modernc.org/sqlite or
// mattn/go-sqlite3 are SQLite. It fails for any other driver; set
// Config.Dialect then.
func DetectDialect(db *sql.DB) (Dialect, error) {
	switch pkg := driverPkg(db); {
	case strings.Contains(pkg, "jackc/pgx"), strings.Contains(pkg, "lib/pq"):
		return Postgres, nil
	case strings.Contains(pkg, "go-sql-driver/mysql"):
		return MySQL, nil
	case strings.Contains(pkg, "sqlite"):
		return SQLite, nil
	default:
		return "", fmt.Errorf("sqlstore: cannot tell the dialect of driver %T (package %s): set Config.Dialect", db.Driver(), pkg)
	}
}

// driverPkg is the package path of db's driver.
func driverPkg(db *sql.DB) string {
	t := reflect.TypeOf(db.Driver())
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// identPart is the strict pattern of a table name (and of its optional
// schema prefix): lowercase ASCII letters, digits and underscores, not
// starting with a digit. Lowercase only, so the name means the same table
// quoted or not, on every dialect and file system.
var identPart = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxTableLen bounds the table part of the name, leaving room for the
// suffixes of index and partition names within PostgreSQL's 63 bytes.
const maxTableLen = 48

// checkTable validates a table name, "table" or "schema.table" (the schema
// form is not available on SQLite).
func checkTable(name string, d Dialect) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 || (len(parts) == 2 && d == SQLite) {
		return fmt.Errorf("%w: Table %q: want table or schema.table (schema not on SQLite)", ErrInvalidTable, name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return fmt.Errorf("%w: Table %q must match %s (lowercase letters, digits, underscores)", ErrInvalidTable, name, identPart)
		}
		if len(p) > 63 {
			return fmt.Errorf("%w: Table %q: %q is longer than 63 bytes", ErrInvalidTable, name, p)
		}
	}
	if t := parts[len(parts)-1]; len(t) > maxTableLen {
		return fmt.Errorf("%w: Table %q: table part must be at most %d bytes, got %d", ErrInvalidTable, name, maxTableLen, len(t))
	}
	return nil
}

// queries builds every SQL statement the store runs, for one dialect and
// one table. All SQL text lives here, so that a later batched (group
// commit) claim only has to add builders.
type queries struct {
	d      Dialect
	schema string // unquoted schema, "" when none
	name   string // unquoted table name
	table  string // quoted, possibly schema-qualified table

	insertProcessing string // id, token, expires
	insertDone       string // id, expires

	// partitioned is the PostgreSQL daily-partitioned layout: the primary
	// key is (id, expires_at), so uniqueness of id is kept by an advisory
	// lock per id (lockClass, id prefix) taken before reading and inserting.
	partitioned bool
	lockClass   int32
}

func newQueries(d Dialect, table string, partitioned bool) *queries {
	q := &queries{d: d, name: table, partitioned: partitioned}
	h := fnv.New32a()
	h.Write([]byte("sqlstore:" + table))
	q.lockClass = int32(h.Sum32())
	if i := strings.IndexByte(table, '.'); i >= 0 {
		q.schema, q.name = table[:i], table[i+1:]
		q.table = q.quote(q.schema) + "." + q.quote(q.name)
	} else {
		q.table = q.quote(table)
	}
	if d == Postgres {
		ins := "INSERT INTO " + q.table + " (id, token, expires_at) VALUES (%s, %s, %s)"
		q.insertProcessing = fmt.Sprintf(ins, q.ph(1), q.ph(2), q.ph(3))
		q.insertDone = fmt.Sprintf(ins, q.ph(1), "NULL", q.ph(2))
	} else {
		ins := "INSERT INTO " + q.table + " (id, state, token, expires_at) VALUES (%s, %d, %s, %s)"
		q.insertProcessing = fmt.Sprintf(ins, q.ph(1), stateProcessing, q.ph(2), q.ph(3))
		q.insertDone = fmt.Sprintf(ins, q.ph(1), stateDone, "NULL", q.ph(2))
	}
	if !partitioned {
		// Partitioned: a plain INSERT, made under the id's advisory lock
		// after reading that no row exists.
		q.insertProcessing += q.onConflictDoNothing()
		q.insertDone += q.onConflictDoNothing()
	}
	return q
}

// insertProcessingRows (MySQL) inserts n processing records, leaving
// existing ones alone. Args: (id, token, expires) per record.
func (q *queries) insertProcessingRows(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (id, state, token, expires_at) VALUES ", q.table)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(?, %d, ?, ?)", stateProcessing)
	}
	b.WriteString(q.onConflictDoNothing())
	return b.String()
}

// fencedRows (MySQL) applies n calls of kind k to records the batch has
// locked and found owned by the calls' tokens. Args:
//
//	complete: (id, expires) per record, (id, data) per record, ids
//	extend:   (id, expires) per record, ids
//	release:  ids
func (q *queries) fencedRows(k opKind, n int) string {
	cases := func() string {
		var b strings.Builder
		b.WriteString("CASE id")
		for range n {
			b.WriteString(" WHEN ? THEN ?")
		}
		b.WriteString(" END")
		return b.String()
	}
	in := q.list(1, n)
	switch k {
	case opComplete:
		return fmt.Sprintf("UPDATE %s SET state = %d, token = NULL, expires_at = %s, data = %s WHERE id IN %s", q.table, stateDone, cases(), cases(), in)
	case opExtend:
		return fmt.Sprintf("UPDATE %s SET expires_at = %s WHERE id IN %s", q.table, cases(), in)
	default:
		return fmt.Sprintf("DELETE FROM %s WHERE id IN %s", q.table, in)
	}
}

// stateExpr is a record's state (stateProcessing or stateDone). The
// PostgreSQL table has no state column: a processing record always has a
// token and a done record never has one, so the token's nullness is the
// state, and a done record is 8 bytes smaller (48 instead of 56, with the
// alignment of its columns).
func (q *queries) stateExpr() string {
	if q.d == Postgres {
		return fmt.Sprintf("CASE WHEN token IS NULL THEN %d ELSE %d END", stateDone, stateProcessing)
	}
	return "state"
}

// setState is the SET clause part that stores state st ("" on
// PostgreSQL, where the token stores it).
func (q *queries) setState(st int) string {
	if q.d == Postgres {
		return ""
	}
	return fmt.Sprintf("state = %d, ", st)
}

// isDone is a predicate true for done records.
func (q *queries) isDone() string {
	if q.d == Postgres {
		return "token IS NULL"
	}
	return fmt.Sprintf("state = %d", stateDone)
}

// advisoryLock serialises every claim and Begin of one id on the
// partitioned layout. Args: lockClass, id prefix (int32 each). Two ids
// sharing a prefix only wait for each other.
const advisoryLock = "SELECT pg_advisory_xact_lock($1, $2)"

func (q *queries) lockArgs(id recordID) []any {
	return []any{q.lockClass, int32(binary.BigEndian.Uint32(id[:4]))}
}

// partitionSuffix is appended to the table name for a day's partition.
const partitionSuffix = "_p20060102"

func (q *queries) partitionName(day time.Time) string {
	return q.name + day.UTC().Format(partitionSuffix)
}

func (q *queries) qualified(name string) string {
	if q.schema != "" {
		return q.quote(q.schema) + "." + q.quote(name)
	}
	return q.quote(name)
}

// createPartition creates the partition holding the records that expire
// on day (UTC).
func (q *queries) createPartition(day time.Time) string {
	from := day.UTC().Truncate(24 * time.Hour)
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		q.qualified(q.partitionName(from)), q.table, from.Format("2006-01-02 15:04:05-07"), from.Add(24*time.Hour).Format("2006-01-02 15:04:05-07"))
}

// listPartitions lists the partitions: name and estimated row count.
// Args: the quoted table name.
const listPartitions = `SELECT c.relname, GREATEST(c.reltuples, 0)::bigint FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`

func (q *queries) quote(ident string) string {
	if q.d == MySQL {
		return "`" + ident + "`"
	}
	return `"` + ident + `"`
}

// ph is the i-th (1-based) placeholder.
func (q *queries) ph(i int) string {
	if q.d == Postgres {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// list is "(p_from, ..., p_from+n-1)".
func (q *queries) list(from, n int) string {
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

// existedMark is the last insert id a MySQL INSERT with
// onConflictDoNothing reports when the id existed: no AUTO_INCREMENT
// column a user may add to the table ever reaches it.
const existedMark = math.MaxInt64

// onConflictDoNothing makes an INSERT leave an existing record unchanged.
// Whether it inserted is told by [queries.inserted].
//
// On MySQL the row keeps its state, and the statement's last insert id is
// set to existedMark when the row existed; a fresh row reports 0, or the
// value of an AUTO_INCREMENT column a user added. The rows-affected count
// cannot tell the two apart on every connection: with go-sql-driver's
// clientFoundRows=true (CLIENT_FOUND_ROWS) a row found and left unchanged
// counts as 1, as an insert does. Unlike INSERT IGNORE, it locks the
// existing row exclusively (no shared lock to upgrade, so no deadlock
// between two duplicates) and turns no other error into a warning.
func (q *queries) onConflictDoNothing() string {
	if q.d == MySQL {
		return fmt.Sprintf(" ON DUPLICATE KEY UPDATE state = IF(LAST_INSERT_ID(%d) > 0, state, state)", existedMark)
	}
	return " ON CONFLICT (id) DO NOTHING"
}

// inserted reports whether a single-row INSERT with onConflictDoNothing
// inserted its row (false: the id existed).
func (q *queries) inserted(res sql.Result) (bool, error) {
	if q.d == MySQL {
		id, err := res.LastInsertId()
		if err != nil {
			return false, err
		}
		return id != existedMark, nil
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

func (q *queries) forUpdate() string {
	if q.d == SQLite {
		return "" // the write lock taken by the first INSERT already serialises
	}
	return " FOR UPDATE"
}

// selectRows reads the records of n ids: id, state, live (1 or 0), data
// and token. Args: now, ids...
func (q *queries) selectRows(n int, lock bool) string {
	idExpr := "id"
	if q.d == Postgres {
		idExpr = "id::text"
	}
	s := "SELECT " + idExpr + ", " + q.stateExpr() + ", CASE WHEN expires_at > " + q.ph(1) + " THEN 1 ELSE 0 END, data, token FROM " +
		q.table + " WHERE id IN " + q.list(2, n)
	if lock {
		s += q.forUpdate()
	}
	return s
}

// takeover turns n expired records into processing records of a new
// claim. Args: token, expires, ids...
func (q *queries) takeover(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = %s, expires_at = %s, data = NULL WHERE id IN %s",
		q.table, q.setState(stateProcessing), q.ph(1), q.ph(2), q.list(3, n))
}

// replaceDone turns n expired records into done records of an inbox
// transaction. Args: expires, ids...
func (q *queries) replaceDone(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = NULL, expires_at = %s, data = NULL WHERE id IN %s",
		q.table, q.setState(stateDone), q.ph(1), q.list(2, n))
}

// setData stores data on n records an inbox transaction inserted, which
// expire at expires. Args: data, expires, ids...
//
// The records are found by primary key: MySQL would otherwise use the
// expires_at index, and lock the index range after them, where every
// newer record goes, until the (possibly long, joined) transaction ends.
func (q *queries) setData(n int) string {
	table := q.table
	if q.d == MySQL {
		table += " FORCE INDEX (PRIMARY)"
	}
	return fmt.Sprintf("UPDATE %s SET data = %s WHERE expires_at = %s AND id IN %s", table, q.ph(1), q.ph(2), q.list(3, n))
}

// The fenced statements end in "WHERE token = ? AND id IN (...)": their
// args are the SET args, then the token, then the ids. Done records have a
// NULL token, so they never match.

// complete: args expires, data, token, ids...
func (q *queries) complete(n int) string {
	return fmt.Sprintf("UPDATE %s SET %stoken = NULL, expires_at = %s, data = %s WHERE token = %s AND id IN %s",
		q.table, q.setState(stateDone), q.ph(1), q.ph(2), q.ph(3), q.list(4, n))
}

// extend: args expires, token, ids...
func (q *queries) extend(n int) string {
	return fmt.Sprintf("UPDATE %s SET expires_at = %s WHERE token = %s AND id IN %s",
		q.table, q.ph(1), q.ph(2), q.list(3, n))
}

// release: args token, ids...
func (q *queries) release(n int) string {
	return fmt.Sprintf("DELETE FROM %s WHERE token = %s AND id IN %s", q.table, q.ph(1), q.list(2, n))
}

// owned counts the records of n ids still owned by a token, locking them.
// Args: token, ids...
func (q *queries) owned(n int, lock bool) string {
	s := fmt.Sprintf("SELECT id FROM %s WHERE token = %s AND id IN %s", q.table, q.ph(1), q.list(2, n))
	if lock {
		s += q.forUpdate()
	}
	return s
}

// purge deletes at most limit expired records: done records whose
// retention ended before now, and processing records whose lease ended
// before graceCutoff. Args: now, graceCutoff, limit.
func (q *queries) purge() string {
	pred := fmt.Sprintf("expires_at < %s AND (%s OR expires_at < %s)", q.ph(1), q.isDone(), q.ph(2))
	switch q.d {
	case Postgres:
		// A TID scan over a bounded, locked batch: no long row-by-row
		// statement, and SKIP LOCKED never waits on a row a claim holds.
		return fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE %s LIMIT %s FOR UPDATE SKIP LOCKED)) AND %s",
			q.table, q.table, pred, q.ph(3), pred)
	case MySQL:
		return fmt.Sprintf("DELETE FROM %s WHERE %s ORDER BY expires_at LIMIT %s", q.table, pred, q.ph(3))
	default:
		return fmt.Sprintf("DELETE FROM %s WHERE id IN (SELECT id FROM %s WHERE %s LIMIT %s)", q.table, q.table, pred, q.ph(3))
	}
}

// purgeBlocks (PostgreSQL, plain layout) deletes at most limit expired
// records (as purge) within a range of heap blocks [from, to): a TID range
// scan (PostgreSQL 14 and later) reads only those blocks, so no index on
// expires_at is needed. Args: now, graceCutoff, limit, from and to as
// '(block,0)' tid literals.
func (q *queries) purgeBlocks() string {
	pred := fmt.Sprintf("expires_at < $1 AND (%s OR expires_at < $2)", q.isDone())
	return fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE ctid >= $4::text::tid AND ctid < $5::text::tid AND %s LIMIT $3 FOR UPDATE SKIP LOCKED)) AND %s",
		q.table, q.table, pred, pred)
}

// heapBlocks returns the number of blocks of the table's heap. Args: the
// quoted table name.
const heapBlocks = "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint, current_setting('server_version_num')::int"

// schema is the DDL that CreateSchema runs, one statement per element.
// Every statement is idempotent. README.md shows the same text for the
// default table name (a test keeps them in sync).
func (q *queries) schemaStatements() []string {
	idx := q.name + "_expires_idx" // MySQL, SQLite
	switch {
	case q.partitioned:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + q.table + ` (
    id         uuid        NOT NULL,
    token      bigint,
    expires_at timestamptz NOT NULL,
    data       bytea,
    PRIMARY KEY (id, expires_at)
) PARTITION BY RANGE (expires_at)`,
		}
	case q.d == Postgres:
		// No index on expires_at: Complete changes it, and an update of
		// an indexed column is never HOT before PostgreSQL 16 (it would
		// add a primary-key entry per record). The purge scans block
		// ranges instead (purgeBlocks).
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + q.table + ` (
    id         uuid        NOT NULL,
    token      bigint,
    expires_at timestamptz NOT NULL,
    data       bytea,
    PRIMARY KEY (id)
)`,
		}
	case q.d == MySQL:
		return []string{
			"CREATE TABLE IF NOT EXISTS " + q.table + " (\n" +
				"    id         BINARY(16) NOT NULL,\n" +
				"    state      TINYINT    NOT NULL,\n" +
				"    token      BIGINT     NULL,\n" +
				"    expires_at BIGINT     NOT NULL,\n" +
				"    data       MEDIUMBLOB NULL,\n" +
				"    PRIMARY KEY (id),\n" +
				"    KEY " + q.quote(idx) + " (expires_at)\n" +
				") ENGINE = InnoDB",
		}
	default:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + q.table + ` (
    id         BLOB    NOT NULL PRIMARY KEY,
    state      INTEGER NOT NULL,
    token      INTEGER,
    expires_at INTEGER NOT NULL,
    data       BLOB
) WITHOUT ROWID`,
			`CREATE INDEX IF NOT EXISTS ` + q.quote(idx) + ` ON ` + q.table + ` (expires_at)`,
		}
	}
}

// idArg is the query argument for a record id: a uuid literal on
// PostgreSQL (valid in every pgx query mode), the 16 bytes elsewhere.
func (q *queries) idArg(id recordID) any {
	if q.d == Postgres {
		return id.uuid()
	}
	return id[:]
}

// idKey is what selectRows returns in its id column for id, as a string.
func (q *queries) idKey(id recordID) string {
	if q.d == Postgres {
		return id.uuid()
	}
	return string(id[:])
}

// timeArg is the query argument for an instant: a timestamptz on
// PostgreSQL, unix microseconds elsewhere (time zone free). The database
// keeps microseconds: t is rounded up to one, so that an expiry computed
// as now (already truncated, see Store.now) plus a duration never loses a
// lease or retention shorter than a microsecond, or a fraction of one.
func (q *queries) timeArg(t time.Time) any {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		t = r.Add(time.Microsecond)
	}
	if q.d == Postgres {
		return t.UTC()
	}
	return t.UnixMicro()
}

// recordID is the 128-bit digest of (scope, key) that keys the table.
type recordID [16]byte

func (id recordID) uuid() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// txDead reports an error after which the transaction the statement ran
// in is over on the server although the client's *sql.Tx is still open:
// MySQL rolls a whole transaction back on a deadlock, and then knows none
// of its savepoints; PostgreSQL refuses every statement of a transaction
// aborted by an earlier error until it is rolled back.
func (q *queries) txDead(err error) bool {
	if err == nil {
		return false
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch pg.SQLState() {
		case "25P02", "3B001": // in_failed_sql_transaction, invalid_savepoint_specification
			return true
		}
		return false
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1213, 1305: // deadlock (the whole transaction rolled back), savepoint does not exist
			return true
		}
	}
	return false
}

// joinedError marks err with stores.ErrTxAborted when it says that the
// transaction a joined Begin works in is over (txDead).
func (q *queries) joinedError(err error) error {
	if q.txDead(err) && !errors.Is(err, stores.ErrTxAborted) {
		return fmt.Errorf("%w: %w", stores.ErrTxAborted, err)
	}
	return err
}

// classify marks an error of a database that cannot be reached, or says
// it cannot serve now, with stores.ErrUnavailable (the outage class of the
// stores contract). Other errors are returned as they are.
func classify(err error) error {
	if err == nil || errors.Is(err, stores.ErrUnavailable) || !isUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
}

// isUnavailable reports a failure to reach the database or a database that
// cannot serve now: a connection refused, reset, closed or timed out by the
// network, or a server starting, shutting down, out of connections or
// disk, or (SQLite) still locked by another writer after the retries.
func isUnavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller's context ended: its own class, not an outage
		// (context.DeadlineExceeded is also a net.Error).
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		code := pg.SQLState()
		switch {
		case strings.HasPrefix(code, "08"): // connection_exception
			return true
		case code == "57P01", code == "57P02", code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		case code == "53300", code == "53100", code == "58030": // too_many_connections, disk_full, io_error
			return true
		}
		return false
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1040, 1203, // too many connections (server, user)
			1053,                   // server shutdown in progress
			1152, 1159, 1160, 1161, // aborted connection, network read/write errors and timeouts
			1021,                         // disk full
			2002, 2003, 2006, 2013, 2055: // client: cannot connect, server gone, lost connection
			return true
		}
		return false
	}
	if code, ok := sqliteCode(err); ok {
		switch code & 0xff {
		case 5, 6, 10, 13, 14: // BUSY, LOCKED, IOERR, FULL, CANTOPEN
			return true
		}
	}
	return false
}

// isRetryable reports a transient conflict that a fresh attempt of the
// whole operation resolves: a serialization failure or deadlock, a lock
// wait timeout, a busy SQLite database, or errRetry.
func isRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errRetry) {
		return true
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch pg.SQLState() {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return true
		}
		return false
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1213, 1205, 1020: // deadlock, lock wait timeout, record changed (MariaDB snapshot isolation)
			return true
		}
		return false
	}
	if code, ok := sqliteCode(err); ok {
		switch code & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
	}
	return false
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
