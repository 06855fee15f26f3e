package sqlstore

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/dedup/stores"
)

// sqliteError has the Code method of modernc.org/sqlite's errors (whose
// fields are unexported).
type sqliteError int

func (e sqliteError) Error() string { return fmt.Sprintf("sqlite error %d", int(e)) }
func (e sqliteError) Code() int     { return int(e) }

// TestClassify: the class of each server error the store meets during
// failovers, restarts and overload, in the drivers' own error types with
// the servers' codes (README.md lists them). A transient conflict is
// retried inside the store (errRetryable); one that ended the
// transaction is also errTxDead, which a joined Begin reports as
// stores.ErrTxAborted.
func TestClassify(t *testing.T) {
	type want struct {
		unavailable, tooLarge bool
		class                 errClass
	}
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	my := func(n uint16) error { return fmt.Errorf("exec: %w", &mysql.MySQLError{Number: n, Message: "m"}) }
	unavailable := want{unavailable: true, class: errUnavailable}
	tooLarge := want{tooLarge: true, class: errTooLarge}
	none := want{}
	for _, c := range []struct {
		d    dialect
		name string
		err  error
		want want
	}{
		{newPostgres("t", false), "57P01 admin_shutdown (pg_terminate_backend)", pg("57P01"), unavailable},
		{newPostgres("t", false), "57P02 crash_shutdown", pg("57P02"), unavailable},
		{newPostgres("t", false), "57P03 cannot_connect_now", pg("57P03"), unavailable},
		{newPostgres("t", false), "53300 too_many_connections", pg("53300"), unavailable},
		{newPostgres("t", false), "53100 disk_full", pg("53100"), unavailable},
		{newPostgres("t", false), "53200 out_of_memory", pg("53200"), unavailable},
		{newPostgres("t", false), "58030 io_error", pg("58030"), unavailable},
		{newPostgres("t", false), "08006 connection_failure", pg("08006"), unavailable},
		{newPostgres("t", false), "08001 sqlclient_unable_to_establish_sqlconnection", pg("08001"), unavailable},
		{newPostgres("t", false), "40001 serialization_failure", pg("40001"), want{class: errRetryable}},
		{newPostgres("t", false), "40P01 deadlock_detected", pg("40P01"), want{class: errRetryable}},
		{newPostgres("t", false), "55P03 lock_not_available", pg("55P03"), want{class: errRetryable}},
		{newPostgres("t", false), "25P02 in_failed_sql_transaction", pg("25P02"), want{class: errTxDead}},
		{newPostgres("t", false), "54000 program_limit_exceeded", pg("54000"), tooLarge},
		{newPostgres("t", false), "57014 query_canceled", pg("57014"), none},
		{newPostgres("t", false), "42P01 undefined_table", pg("42P01"), none},
		{newPostgres("t", false), "42501 insufficient_privilege", pg("42501"), none},

		{newMySQL("t"), "1040 too many connections", my(1040), unavailable},
		{newMySQL("t"), "1203 user max connections", my(1203), unavailable},
		{newMySQL("t"), "1226 user resource limit", my(1226), unavailable},
		{newMySQL("t"), "1053 server shutdown", my(1053), unavailable},
		{newMySQL("t"), "1927 connection killed", my(1927), unavailable},
		{newMySQL("t"), "1969 max_statement_time", my(1969), unavailable},
		{newMySQL("t"), "1290 --read-only", my(1290), unavailable},
		{newMySQL("t"), "1836 read-only mode", my(1836), unavailable},
		{newMySQL("t"), "1153 packet too large", my(1153), tooLarge},
		{newMySQL("t"), "ErrPktTooLarge", mysql.ErrPktTooLarge, tooLarge},
		{newMySQL("t"), "ErrInvalidConn", mysql.ErrInvalidConn, unavailable},
		{newMySQL("t"), "driver.ErrBadConn", fmt.Errorf("x: %w", driver.ErrBadConn), unavailable},
		{newMySQL("t"), "1213 deadlock", my(1213), want{class: errRetryable | errTxDead}},
		{newMySQL("t"), "1205 lock wait timeout", my(1205), want{class: errRetryable}},
		{newMySQL("t"), "1305 savepoint does not exist", my(1305), want{class: errTxDead}},
		{newMySQL("t"), "1146 no such table", my(1146), none},
		{newMySQL("t"), "1142 command denied", my(1142), none},
		{newMySQL("t"), "1317 query interrupted (KILL QUERY)", my(1317), none},

		{newSQLite("t", nil), "SQLITE_BUSY", sqliteError(5), want{unavailable: true, class: errUnavailable | errRetryable}},
		{newSQLite("t", nil), "SQLITE_IOERR_WRITE", sqliteError(10 | 3<<8), unavailable},
		{newSQLite("t", nil), "SQLITE_FULL", sqliteError(13), unavailable},
		{newSQLite("t", nil), "SQLITE_TOOBIG", sqliteError(18), tooLarge},
		{newSQLite("t", nil), "SQLITE_CONSTRAINT", sqliteError(19), none},

		{newPostgres("t", false), "io.EOF", io.EOF, unavailable},
		{newPostgres("t", false), "net.OpError", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, unavailable},
	} {
		s := &Store{d: c.d}
		got := s.classify(c.err)
		if errors.Is(got, stores.ErrUnavailable) != c.want.unavailable || errors.Is(got, stores.ErrTooLarge) != c.want.tooLarge {
			t.Errorf("%T %s: classify = %v; want ErrUnavailable %t, ErrTooLarge %t", c.d, c.name, got, c.want.unavailable, c.want.tooLarge)
		}
		if class := c.d.classify(c.err); class&^errUnavailable != c.want.class&^errUnavailable {
			t.Errorf("%T %s: class %03b, want %03b", c.d, c.name, class, c.want.class)
		}
		if joined := s.joinedError(c.err); errors.Is(joined, stores.ErrTxAborted) != (c.want.class&errTxDead != 0) {
			t.Errorf("%T %s: joinedError = %v; ErrTxAborted want %t", c.d, c.name, joined, c.want.class&errTxDead != 0)
		}
	}
}
