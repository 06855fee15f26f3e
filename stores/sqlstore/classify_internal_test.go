package sqlstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	kit "github.com/watermill-dedup/dedup/internal/testkit/base"
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
		{newPostgres("t", false), "57P01 admin_shutdown (a fast shutdown: a new connection refused)", pg("57P01"), want{unavailable: true, class: errConnLost}},
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
		{newMySQL("t"), "1203 max_user_connections (the administrator's limit on every user)", my(1203), refusal},
		{newMySQL("t"), "1226 a user's resource limit (MAX_CONNECTIONS_PER_HOUR, MAX_USER_CONNECTIONS)", my(1226), refusal},
		{newMySQL("t"), "1053 server shutdown", my(1053), unavailable},
		{newMySQL("t"), "1927 connection killed", my(1927), unavailable},
		{newMySQL("t"), "1969 max_statement_time", my(1969), unavailable},
		{newMySQL("t"), "1290 --read-only", my(1290), unavailable},
		{newMySQL("t"), "1836 read-only mode", my(1836), unavailable},
		{newMySQL("t"), "1153 packet too large", my(1153), tooLarge},
		{newMySQL("t"), "ErrPktTooLarge", mysql.ErrPktTooLarge, tooLarge},
		{newMySQL("t"), "ErrInvalidConn (nothing listens any more)", mysql.ErrInvalidConn, want{unavailable: true, class: errConnLost}},
		{newMySQL("t"), "driver.ErrBadConn (nothing listens any more)", fmt.Errorf("x: %w", driver.ErrBadConn), want{unavailable: true}},
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

		{newPostgres("t", false), "io.EOF (nothing listens any more)", io.EOF, want{unavailable: true}},
		{newPostgres("t", false), "a reset (nothing listens any more)", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, want{unavailable: true}},
		{newPostgres("t", false), "a TLS alert", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, want{refused: true}},
	} {
		// A store whose database is down since: a connection that broke
		// is confirmed an outage by a new dial, refused
		// (TestClassifyConnectionErrors).
		s := &Store{d: c.d, db: probeDB(t, dialRefused)}
		got := s.classify(context.Background(), c.err)
		if errors.Is(got, stores.ErrUnavailable) != c.want.unavailable || errors.Is(got, stores.ErrTooLarge) != c.want.tooLarge || errors.Is(got, ErrRefused) != c.want.refused {
			t.Errorf("%T %s: classify = %v; want ErrUnavailable %t, ErrTooLarge %t, ErrRefused %t", c.d, c.name, got, c.want.unavailable, c.want.tooLarge, c.want.refused)
		}
		if class := c.d.classify(c.err); class&^errUnavailable != c.want.class&^errUnavailable {
			t.Errorf("%T %s: class %06b, want %06b", c.d, c.name, class, c.want.class)
		}
		if joined := s.joinedError(context.Background(), c.err); errors.Is(joined, stores.ErrTxAborted) != (c.want.class&errTxDead != 0) {
			t.Errorf("%T %s: joinedError = %v; ErrTxAborted want %t", c.d, c.name, joined, c.want.class&errTxDead != 0)
		}
	}
}

// dialRefused is the error of a dial to a port where nothing listens.
var dialRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// probeConnector is a driver.Connector whose Connect fails with err, or,
// when err is nil, returns a connection whose Ping succeeds: what the
// store's confirmation of a broken connection meets.
type probeConnector struct{ err error }

func (c probeConnector) Connect(context.Context) (driver.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	return pingConn{}, nil
}

func (probeConnector) Driver() driver.Driver { return nil }

type pingConn struct{}

func (pingConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not a real connection") }
func (pingConn) Close() error                        { return nil }
func (pingConn) Begin() (driver.Tx, error)           { return nil, errors.New("not a real connection") }
func (pingConn) Ping(context.Context) error          { return nil }

// probeDB is a pool whose new connections fail with err (nil: succeed).
func probeDB(t *testing.T, err error) *sql.DB {
	db := sql.OpenDB(probeConnector{err})
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// pgConnectError is the error pgx returns for a connection to addr that
// could not be set up.
func pgConnectError(t *testing.T, addr string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, "postgres://u@"+addr+"/db?sslmode=disable&connect_timeout=10")
	if err == nil {
		_ = c.Close(ctx)
		t.Fatalf("pgconn.Connect to %s succeeded", addr)
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("pgconn.Connect to %s: %v, not a ConnectError", addr, err)
	}
	return err
}

// TestClassifyConnectionErrors: an error is an outage only when it is
// known to be one. A dial refused or timed out, a timeout, an
// unreachable network, a server that says it cannot serve now are,
// whatever the store heard before; a refusal of the client (its
// credentials, its TLS) never is. A connection that broke with no word of
// why (a reset, an EOF, a bad or invalid connection) is one only when a
// new connection of the pool, tried on that error alone, finds nothing
// listening (or a server saying it cannot serve); not when the new
// connection is set up and refused, or lost again, or works. A
// connection pgx reports broken while it was being set up (a
// ConnectError) is never one: its dial had succeeded.
func TestClassifyConnectionErrors(t *testing.T) {
	op := func(o string, err error) error {
		return &net.OpError{Op: o, Net: "tcp", Err: err}
	}
	always := []error{
		dialRefused,
		op("dial", os.NewSyscallError("connect", syscall.EHOSTUNREACH)),
		op("dial", &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}),
		op("read", os.ErrDeadlineExceeded),
		op("write", os.NewSyscallError("write", syscall.ENETUNREACH)),
		pgConnectError(t, kit.ClosedAddr(t)), // pgx: the dial refused
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
	broken := []error{
		op("read", os.NewSyscallError("read", syscall.ECONNRESET)),
		op("dial", os.NewSyscallError("connect", syscall.ECONNRESET)), // accepted, then reset
		op("write", os.NewSyscallError("write", syscall.EPIPE)),
		io.EOF, io.ErrUnexpectedEOF, driver.ErrBadConn,
	}
	setupLost := pgConnectError(t, kit.Closing(t, true)) // pgx: accepted, then reset or closed while being set up
	for _, c := range []struct {
		d                            dialect
		busy, refusal, handshakeLost error
		connLost                     error
		never                        []error
	}{
		{newPostgres("t", false), &pgconn.PgError{Code: "57P03"}, &pgconn.PgError{Code: "28P01"}, setupLost, io.EOF, []error{setupLost}},
		{newMySQL("t"), &mysql.MySQLError{Number: 1040}, &mysql.MySQLError{Number: 1045}, mysql.ErrInvalidConn, mysql.ErrInvalidConn, nil},
	} {
		for _, p := range []struct {
			name   string
			err    error // of the new connection
			outage bool  // of a broken connection
			refuse bool
		}{
			{"nothing listens", dialRefused, true, false},
			{"the dial timed out", op("dial", &timeoutError{}), true, false},
			{"the server cannot serve now", c.busy, true, false},
			{"the server answers", nil, false, false},
			{"the server refuses the client", c.refusal, false, true},
			{"the server closes the connection while it is set up", c.handshakeLost, false, false},
			{"the dial is reset", op("dial", os.NewSyscallError("connect", syscall.ECONNRESET)), false, false},
		} {
			s := &Store{d: c.d, db: probeDB(t, p.err)}
			check := func(err error, outage, refused bool) {
				t.Helper()
				got := s.classify(context.Background(), fmt.Errorf("exec: %w", err))
				if errors.Is(got, stores.ErrUnavailable) != outage || errors.Is(got, ErrRefused) != refused {
					t.Errorf("%T, a new connection: %s: classify(%v) = %v, want an outage %t, a refusal %t", c.d, p.name, err, got, outage, refused)
				}
			}
			for _, err := range append(broken, c.connLost) {
				check(err, p.outage, p.refuse)
			}
			for _, err := range always {
				check(err, true, false)
			}
			for _, err := range append(never, c.never...) {
				check(err, false, false)
			}
			for _, err := range append(refusals, c.refusal) {
				check(err, false, true)
			}
			check(c.busy, true, false)
		}
	}

	// A confirmation the call's context cuts short: that end.
	s := &Store{d: newMySQL("t"), db: probeDB(t, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.classify(ctx, mysql.ErrInvalidConn); !errors.Is(err, context.Canceled) || errors.Is(err, stores.ErrUnavailable) {
		t.Errorf("a broken connection, the call's context ended: %v, want context.Canceled", err)
	}
}

// timeoutError is a net.Error that timed out.
type timeoutError struct{}

func (*timeoutError) Error() string   { return "i/o timeout" }
func (*timeoutError) Timeout() bool   { return true }
func (*timeoutError) Temporary() bool { return true }
