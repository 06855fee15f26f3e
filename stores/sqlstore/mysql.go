package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"math"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQL and MariaDB: a state column, ids as BINARY(16), unix microseconds,
// no RETURNING, an on-conflict clause that reports through the last
// insert id, batches of multi-row statements, autocommit and COMMIT
// quirks.

// MaxDataMySQL is the default and largest Config.MaxData on MySQL and
// MariaDB, 16 MiB - 1 KiB: the data column, a MEDIUMBLOB, keeps 16 MiB -
// 1, and a statement must fit the server's max_allowed_packet (16 MiB by
// default on MariaDB, 64 MiB on MySQL 8), with 1 KiB for the rest of
// the statement. (Data is never truncated: a session with a non-strict
// sql_mode would cut a longer value to the column's size without an
// error, so none is ever sent.)
const MaxDataMySQL = 1<<24 - mysqlStatementRoom

// mysqlInfo describes MySQL and MariaDB to New, Validate and DetectDialect.
var mysqlInfo = dialectInfo{
	maxData: MaxDataMySQL,
	drivers: []string{"go-sql-driver/mysql"},
	open: func(table string, _ bool, _ *sql.DB) dialect {
		return newMySQL(table)
	},
}

type mysqlDialect struct {
	base
	q          statements
	schemaName string // unquoted, "" when none
	name       string // unquoted table name
}

var _ dialect = (*mysqlDialect)(nil)

// existedMark is the last insert id an INSERT with onConflict reports
// when the id existed: no AUTO_INCREMENT column a user may add to the
// table ever reaches it.
const existedMark = math.MaxInt64

// onConflict makes an INSERT leave an existing record unchanged. The row
// keeps its state, and the statement's last insert id is set to
// existedMark when the row existed; a fresh row reports 0, or the value
// of an AUTO_INCREMENT column a user added. The rows-affected count
// cannot tell the two apart on every connection: with go-sql-driver's
// clientFoundRows=true (CLIENT_FOUND_ROWS) a row found and left unchanged
// counts as 1, as an insert does. Unlike INSERT IGNORE, it locks the
// existing row exclusively (no shared lock to upgrade, so no deadlock
// between two duplicates) and turns no other error into a warning.
var mysqlOnConflict = fmt.Sprintf(" ON DUPLICATE KEY UPDATE state = IF(LAST_INSERT_ID(%d) > 0, state, state)", existedMark)

func newMySQL(table string) *mysqlDialect {
	d := &mysqlDialect{}
	d.schemaName, d.name = splitTable(table)
	q := &d.q
	q.table = mysqlQuote(d.name)
	if d.schemaName != "" {
		q.table = mysqlQuote(d.schemaName) + "." + q.table
	}
	q.ph = func(int) string { return "?" }
	q.setState = func(st int) string { return fmt.Sprintf("state = %d, ", st) }
	q.forUpdate = " FOR UPDATE"
	q.selectFrom = "SELECT id, state, CASE WHEN expires_at > ? THEN 1 ELSE 0 END, data, token FROM " + q.table
	// setData finds the records by primary key: MySQL would otherwise use
	// the expires_at index, and lock the index range after them, where
	// every newer record goes, until the (possibly long, joined)
	// transaction ends.
	q.setDataTable = q.table + " FORCE INDEX (PRIMARY)"
	ins := "INSERT INTO " + q.table + " (id, state, token, expires_at) VALUES (?, %d, %s, ?)" + mysqlOnConflict
	q.insertProcessing = "INSERT INTO " + q.table + " (id, state, token, expires_at, data) VALUES (?, " + fmt.Sprint(stateProcessing) + ", ?, ?, ?)" + mysqlOnConflict
	q.insertDone = fmt.Sprintf(ins, stateDone, "NULL")
	return d
}

func mysqlQuote(ident string) string { return "`" + ident + "`" }

func (d *mysqlDialect) sql() *statements { return &d.q }

func (d *mysqlDialect) schema() []string {
	return []string{
		"CREATE TABLE IF NOT EXISTS " + d.q.table + " (\n" +
			"    id         BINARY(16) NOT NULL,\n" +
			"    state      TINYINT    NOT NULL,\n" +
			"    token      BIGINT     NULL,\n" +
			"    expires_at BIGINT     NOT NULL,\n" +
			"    data       MEDIUMBLOB NULL,\n" +
			"    PRIMARY KEY (id),\n" +
			"    KEY " + mysqlQuote(d.name+"_expires_idx") + " (expires_at)\n" +
			") ENGINE = InnoDB",
	}
}

func (d *mysqlDialect) idArg(id recordID) any { return id[:] }

// timeArg is unix microseconds: time zone free.
func (d *mysqlDialect) timeArg(t time.Time) any { return roundUp(t).UnixMicro() }

func (d *mysqlDialect) inserted(res sql.Result) (bool, error) {
	id, err := res.LastInsertId()
	if err != nil {
		return false, err
	}
	return id != existedMark, nil
}

func (d *mysqlDialect) quirks() quirks {
	return quirks{
		// READ COMMITTED: no gap locks (fewer deadlocks between claims,
		// and a purge never blocks the inserts of new records).
		txOptions:                &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		noopUpdateMatchesNothing: true,
		endIgnoresContext:        true,
	}
}

// mysqlStatementRoom is what a statement carrying data needs beside it
// in its packet.
const mysqlStatementRoom = 1 << 10

// classify: an error with a number is the server's answer; the numbers
// of a server that cannot serve now are outages, those of a server that
// refused the client (access denied, a user that may not connect from
// there, secure transport required, a limit the administrator set on the
// user) refusals. go-sql-driver reports a connection that broke under it
// as "invalid connection", logging the cause and returning none: a reset,
// an EOF, and also the TLS 1.3 alert of a server that refused the
// client's certificate after the client's side of the handshake; and it
// does not tell a connection being set up from one in use. Store.classify
// confirms such an error with a new connection.
func (d *mysqlDialect) classify(err error) errClass {
	if errors.Is(err, mysql.ErrInvalidConn) {
		return errConnLost
	}
	if errors.Is(err, mysql.ErrNoTLS) {
		// TLS asked of a server without it.
		return errRefused
	}
	if errors.Is(err, mysql.ErrPktTooLarge) {
		// The driver's own refusal, before sending: a packet over the
		// DSN's maxAllowedPacket.
		return errTooLarge
	}
	var my *mysql.MySQLError
	if !errors.As(err, &my) {
		return 0
	}
	return mysqlClass(my.Number)
}

// mysqlClass is the class of a MySQL or MariaDB error number.
func mysqlClass(n uint16) errClass {
	switch n {
	case 1044, 1045, 1698, // access denied (to the database; for the user, with or without a password, or its TLS: REQUIRE X509, SUBJECT, ISSUER)
		1049,       // unknown database
		1129, 1130, // host blocked after connection errors, host not allowed to connect
		1251,       // an authentication plugin the client does not support
		1820, 1862, // an expired password
		3118, 4151, // account locked (MySQL, MariaDB)
		3159, // MySQL: insecure transport with require_secure_transport (MariaDB says 1045)
		// A limit the administrator set on the user, not the server's
		// capacity (1040): 1203 max_user_connections (the server's
		// setting for every user), 1226 an account's resource over its
		// limit (MAX_USER_CONNECTIONS, MAX_CONNECTIONS_PER_HOUR,
		// MAX_QUERIES_PER_HOUR, MAX_UPDATES_PER_HOUR).
		1203, 1226:
		return errRefused
	}
	switch n {
	case 1040, // too many connections: the server's max_connections
		1053,                   // server shutdown in progress
		1152, 1159, 1160, 1161, // aborted connection, network read/write errors and timeouts
		1927,       // MariaDB: connection killed (KILL of the store's connection)
		1969, 3024, // statement timeout (MariaDB max_statement_time, MySQL max_execution_time)
		// 1290 is "running with the --X option so it cannot execute this
		// statement": for the store's statements, --read-only or
		// super_read_only (a failover's old primary). 1836: read-only
		// mode.
		1290, 1836,
		1021,                         // disk full
		2002, 2003, 2006, 2013, 2055: // client: cannot connect, server gone, lost connection
		return errUnavailable
	case 1153: // a packet over max_allowed_packet (the server closes the connection)
		return errTooLarge
	case 1213: // deadlock: the whole transaction rolled back
		return errRetryable | errTxDead
	case 1205, 1020: // lock wait timeout, record changed (MariaDB snapshot isolation)
		return errRetryable
	case 1305: // savepoint does not exist: the transaction is gone
		return errTxDead
	}
	return 0
}

// checkSession refuses autocommit off (autocommit=0 in the DSN: remove
// the setting), under which the store's single statements open
// transactions nobody commits, and reads max_allowed_packet: the server refuses a statement larger
// than that (error 1153, closing the connection).
func (d *mysqlDialect) checkSession(ctx context.Context, db *sql.DB) (int, error) {
	var autocommit, packet int64
	if err := db.QueryRowContext(ctx, "SELECT @@autocommit, @@max_allowed_packet").Scan(&autocommit, &packet); err != nil {
		return 0, err
	}
	if autocommit != 1 {
		return 0, fmt.Errorf("%w: the session runs with autocommit=%d, under which the store's statements would never commit", ErrSessionSettings, autocommit)
	}
	return int(max(packet-mysqlStatementRoom, 1)), nil
}

// joinCheck makes sure the joined transaction is alive. A MySQL
// transaction rolled back by the server (a deadlock, a lock wait timeout
// under innodb_rollback_on_timeout) leaves the client's *sql.Tx open, and
// every later statement in it runs in autocommit: SAVEPOINT succeeds
// doing nothing, and the records Begin writes would commit at once,
// whatever the handler does. Rolling back to the savepoint just set is a
// no-op in a live transaction, and fails with 1305 in a dead one.
func (d *mysqlDialect) joinCheck(ctx context.Context, tx *sql.Tx, sp string) error {
	_, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp)
	return err
}

func (d *mysqlDialect) purgePlan(context.Context, *sql.DB, int64) (string, iter.Seq[[]any], error) {
	return fmt.Sprintf("DELETE FROM %s WHERE %s ORDER BY expires_at LIMIT ?", d.q.table, purgePredicate(fmt.Sprintf("state = %d", stateDone), "?", "?")), one, nil
}

// adminSyntax: the id as 16 bytes, the state column, unix microseconds.
func (d *mysqlDialect) adminSyntax() adminSyntax {
	return adminSyntax{id: "id", state: "state", micros: func(expr string) string { return expr }}
}

// mysqlTableSize is InnoDB's estimate of the table's data and indexes. Args:
// the schema (NULL: the connection's database), the table.
const mysqlTableSize = "SELECT COALESCE(SUM(DATA_LENGTH + INDEX_LENGTH), 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"

func (d *mysqlDialect) tableBytes(ctx context.Context, db *sql.DB) (int64, error) {
	var schema any
	if d.schemaName != "" {
		schema = d.schemaName
	}
	var n int64
	err := db.QueryRowContext(ctx, mysqlTableSize, schema, d.name).Scan(&n)
	return n, err
}

// insertProcessingRows inserts n processing records, leaving existing
// ones alone. Args: (id, token, expires) per record.
func (d *mysqlDialect) insertProcessingRows(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (id, state, token, expires_at) VALUES ", d.q.table)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(?, %d, ?, ?)", stateProcessing)
	}
	b.WriteString(mysqlOnConflict)
	return b.String()
}

// fencedRows applies n calls of kind k to records the batch has locked
// and found owned by the calls' tokens. Args:
//
//	complete: (id, expires) per record, (id, data) per record, ids
//	extend:   (id, expires) per record, ids
//	release:  ids
func (d *mysqlDialect) fencedRows(k opKind, n int) string {
	cases := func() string {
		var b strings.Builder
		b.WriteString("CASE id")
		for range n {
			b.WriteString(" WHEN ? THEN ?")
		}
		b.WriteString(" END")
		return b.String()
	}
	in := d.q.list(1, n)
	switch k {
	case opComplete:
		return fmt.Sprintf("UPDATE %s SET state = %d, token = NULL, expires_at = %s, data = %s WHERE id IN %s", d.q.table, stateDone, cases(), cases(), in)
	case opExtend:
		return fmt.Sprintf("UPDATE %s SET expires_at = %s WHERE id IN %s", d.q.table, cases(), in)
	default:
		return fmt.Sprintf("DELETE FROM %s WHERE id IN %s", d.q.table, in)
	}
}

// execBatch runs a batch in one transaction: one multi-row INSERT ... ON
// DUPLICATE KEY UPDATE for the claims, one SELECT ... FOR UPDATE of every
// record of the batch, then for the records still owned by their
// caller's token one UPDATE (Complete, Extend) or DELETE (Release) per
// kind, and the takeovers of expired records, one UPDATE each. MySQL has
// no RETURNING: the locked read tells which claims inserted their row
// (the row carries their token) and which fenced calls still own theirs.
func (d *mysqlDialect) execBatch(ctx context.Context, db *sql.DB, ops []*op, now time.Time) error {
	return inTx(ctx, db, d.quirks().txOptions, func(tx *sql.Tx) error {
		ids := make([]recordID, len(ops))
		var claims []any
		nClaims := 0
		for i, o := range ops {
			ids[i] = o.id()
			if o.kind == opClaim {
				claims = append(claims, d.idArg(o.id()), o.token, d.timeArg(now.Add(o.d)))
				nClaims++
			}
		}
		if nClaims > 0 {
			if _, err := tx.ExecContext(ctx, d.insertProcessingRows(nClaims), claims...); err != nil {
				return err
			}
		}
		recs, err := fetch(ctx, tx, d, ids, now, true)
		if err != nil {
			return err
		}
		var fenced [numOpKinds][]*op
		for _, o := range ops {
			r, ok := recs[idKey(d, o.id())]
			if o.kind != opClaim {
				if !ok || r.state != stateProcessing || r.token != o.token {
					o.err = lostClaim(o.claim)
					continue
				}
				fenced[o.kind] = append(fenced[o.kind], o)
				continue
			}
			if err := claimLocked(ctx, tx, d, o, r, ok, now); err != nil {
				return err
			}
		}
		// The rows are locked and owned: the statements below match them all.
		for k, os := range fenced {
			if len(os) == 0 {
				continue
			}
			var args []any
			if opKind(k) != opRelease {
				for _, o := range os {
					args = append(args, d.idArg(o.id()), d.timeArg(now.Add(o.d)))
				}
			}
			if opKind(k) == opComplete {
				for _, o := range os {
					args = append(args, d.idArg(o.id()), dataArg(o.data))
				}
			}
			for _, o := range os {
				args = append(args, d.idArg(o.id()))
			}
			if _, err := tx.ExecContext(ctx, d.fencedRows(opKind(k), len(os)), args...); err != nil {
				return err
			}
		}
		return nil
	})
}
