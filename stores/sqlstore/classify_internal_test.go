package sqlstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
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
		unavailable, tooLarge, refused bool
		class                          errClass
	}
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	my := func(n uint16) error { return fmt.Errorf("exec: %w", &mysql.MySQLError{Number: n, Message: "m"}) }
	unavailable := want{unavailable: true, class: errUnavailable}
	tooLarge := want{tooLarge: true, class: errTooLarge}
	refusal := want{refused: true, class: errRefused}
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
		{newPostgres("t", false), "28P01 invalid_password", pg("28P01"), refusal},
		{newPostgres("t", false), "28000 invalid_authorization_specification (pg_hba.conf, a client certificate)", pg("28000"), refusal},
		{newPostgres("t", false), "08004 sqlserver_rejected_establishment_of_sqlconnection", pg("08004"), refusal},

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
		{newMySQL("t"), "ErrInvalidConn (answered before)", mysql.ErrInvalidConn, want{unavailable: true, class: errConnLost}},
		{newMySQL("t"), "driver.ErrBadConn (answered before)", fmt.Errorf("x: %w", driver.ErrBadConn), want{unavailable: true}},
		{newMySQL("t"), "1213 deadlock", my(1213), want{class: errRetryable | errTxDead}},
		{newMySQL("t"), "1205 lock wait timeout", my(1205), want{class: errRetryable}},
		{newMySQL("t"), "1305 savepoint does not exist", my(1305), want{class: errTxDead}},
		{newMySQL("t"), "1146 no such table", my(1146), none},
		{newMySQL("t"), "1142 command denied", my(1142), none},
		{newMySQL("t"), "1317 query interrupted (KILL QUERY)", my(1317), none},
		{newMySQL("t"), "1045 access denied (a password, REQUIRE X509, require_secure_transport)", my(1045), refusal},
		{newMySQL("t"), "1044 access denied to the database", my(1044), refusal},
		{newMySQL("t"), "1130 host not allowed", my(1130), refusal},
		{newMySQL("t"), "3159 insecure transport", my(3159), refusal},
		{newMySQL("t"), "ErrNoTLS", mysql.ErrNoTLS, refusal},

		{newSQLite("t", nil), "SQLITE_BUSY", sqliteError(5), want{unavailable: true, class: errUnavailable | errRetryable}},
		{newSQLite("t", nil), "SQLITE_IOERR_WRITE", sqliteError(10 | 3<<8), unavailable},
		{newSQLite("t", nil), "SQLITE_FULL", sqliteError(13), unavailable},
		{newSQLite("t", nil), "SQLITE_TOOBIG", sqliteError(18), tooLarge},
		{newSQLite("t", nil), "SQLITE_CONSTRAINT", sqliteError(19), none},
		{newSQLite("t", nil), "SQLITE_CANTOPEN (a path or a permission to fix)", sqliteError(14), none},

		{newPostgres("t", false), "io.EOF (answered before)", io.EOF, want{unavailable: true}},
		{newPostgres("t", false), "a reset (answered before)", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, want{unavailable: true}},
		{newPostgres("t", false), "a TLS alert", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, want{refused: true}},
	} {
		// A store the database answered: a reset is an outage, unless
		// the refusal of the case itself came first
		// (TestClassifyConnectionErrors).
		s := &Store{d: c.d}
		s.answered.Store(true)
		got := s.classify(c.err)
		if errors.Is(got, stores.ErrUnavailable) != c.want.unavailable || errors.Is(got, stores.ErrTooLarge) != c.want.tooLarge || errors.Is(got, ErrRefused) != c.want.refused {
			t.Errorf("%T %s: classify = %v; want ErrUnavailable %t, ErrTooLarge %t, ErrRefused %t", c.d, c.name, got, c.want.unavailable, c.want.tooLarge, c.want.refused)
		}
		if class := c.d.classify(c.err) &^ errAnswered; class&^errUnavailable != c.want.class&^errUnavailable {
			t.Errorf("%T %s: class %06b, want %06b", c.d, c.name, class, c.want.class)
		}
		if joined := s.joinedError(context.Background(), c.err); errors.Is(joined, stores.ErrTxAborted) != (c.want.class&errTxDead != 0) {
			t.Errorf("%T %s: joinedError = %v; ErrTxAborted want %t", c.d, c.name, joined, c.want.class&errTxDead != 0)
		}
	}
}

// TestClassifyConnectionErrors: an error is an outage only when it is
// known to be one. A dial refused or timed out, a timeout, an
// unreachable network, a server that says it cannot serve now are; a
// reset, an EOF, a bad or invalid connection only from a database that
// has answered the store and not refused it since (a server that turns
// a client away closes its connection too); a refusal of the client (its
// credentials, its TLS) never is.
func TestClassifyConnectionErrors(t *testing.T) {
	op := func(o string, err error) error {
		return &net.OpError{Op: o, Net: "tcp", Err: err}
	}
	always := []error{
		op("dial", os.NewSyscallError("connect", syscall.ECONNREFUSED)),
		op("dial", os.NewSyscallError("connect", syscall.EHOSTUNREACH)),
		op("dial", &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}),
		op("read", os.ErrDeadlineExceeded),
		op("write", os.NewSyscallError("write", syscall.ENETUNREACH)),
	}
	never := []error{
		op("dial", &net.DNSError{Err: "no such host", Name: "db", IsNotFound: true}),
		context.DeadlineExceeded,
	}
	refusals := []error{
		op("remote error", errors.New("tls: certificate required")),
		op("local error", errors.New("tls: bad record MAC")),
		&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}},
		tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"},
	}
	known := []error{
		op("read", os.NewSyscallError("read", syscall.ECONNRESET)),
		op("dial", os.NewSyscallError("connect", syscall.ECONNRESET)),
		op("write", os.NewSyscallError("write", syscall.EPIPE)),
		io.EOF, io.ErrUnexpectedEOF, driver.ErrBadConn,
	}
	for _, c := range []struct {
		d                     dialect
		busy, refusal, answer error
		connLost              error
	}{
		{newPostgres("t", false), &pgconn.PgError{Code: "57P03"}, &pgconn.PgError{Code: "28P01"}, &pgconn.PgError{Code: "42P01"}, io.EOF},
		{newMySQL("t"), &mysql.MySQLError{Number: 1040}, &mysql.MySQLError{Number: 1045}, &mysql.MySQLError{Number: 1146}, mysql.ErrInvalidConn},
	} {
		s := &Store{d: c.d}
		check := func(when string, err error, want bool) {
			t.Helper()
			got := s.classify(fmt.Errorf("exec: %w", err))
			if errors.Is(got, stores.ErrUnavailable) != want {
				t.Errorf("%T %s: classify(%v) = %v, want an outage: %v", c.d, when, err, got, want)
			}
		}
		// all checks the resets first: the others change what the store
		// knows (the server's codes are answers).
		all := func(when string, want bool) {
			t.Helper()
			for _, err := range append(known, c.connLost) {
				check(when, err, want)
			}
			for _, err := range never {
				check(when, err, false)
			}
			for _, err := range always {
				check(when, err, true)
			}
		}
		all("before any answer", false)
		check("before any answer", c.busy, true) // an answer: it cannot serve now
		all("after an answer", true)
		for _, err := range refusals {
			check("after an answer", err, false) // a refusal, remembered
			all("after a refusal of its TLS", false)
			s.heard(nil)
		}
		all("after a result again", true)
		check("after a result again", c.refusal, false)
		if err := s.classify(c.connLost); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.refusal.Error()) {
			t.Errorf("%T: a reset after a refusal: %v, want ErrRefused naming the refusal", c.d, err)
		}
		all("after a refusal of the server", false)
		check("after a refusal of the server", c.answer, false)
		all("after an error the server answered", true)
	}
}
