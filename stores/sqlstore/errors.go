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
	"syscall"

	"github.com/watermill-dedup/dedup/stores"
)

// Error classes: what the store does with an error (report an outage,
// retry, report a dead joined transaction or data too large), each
// dialect classifying its own server's errors.

// ErrSessionSettings is returned by every call on a database whose session
// settings break an assumption of the store: MySQL's autocommit off
// (autocommit=0 in the DSN), under which the store's single statements
// open transactions nobody commits. Fix the DSN; the error names the
// setting. It is checked once, at the first call that reaches the
// database.
var ErrSessionSettings = errors.New("a database session setting breaks the store")

// ErrRefused is wrapped by the error of a database that refused the
// store's client: its credentials (a wrong password, a role or user the
// server does not let in from there), its TLS (a certificate either side
// does not trust, none given where one is required, TLS on one side
// only), its right to connect to the database; and by the reset or EOF of
// a database whose last word to the store was such a refusal. It is never
// an outage: a consumer whose claims fail with it nacks under either
// policy, where an outage (stores.ErrUnavailable) would run its handler
// unprotected under FailOpen for as long as the settings stay wrong.
var ErrRefused = errors.New("sqlstore: the database refused the client")

// errClass is the set of classes an error belongs to, for the store.
type errClass uint8

const (
	// errUnavailable: the database said it cannot serve now
	// (stores.ErrUnavailable): a dialect's server codes. The failures
	// every driver shares are told by isOutage.
	errUnavailable errClass = 1 << iota
	// errRetryable: a transient conflict that a fresh attempt of the
	// whole operation resolves (a deadlock, a serialization failure, a
	// busy SQLite).
	errRetryable
	// errTxDead: the transaction the statement ran in is over on the
	// server although the client's *sql.Tx is still open.
	errTxDead
	// errTooLarge: the server refused the statement for its size, which
	// only a Complete's or Commit's data makes large
	// (stores.ErrTooLarge).
	errTooLarge
	// errRefused: the server refused the client (ErrRefused): its
	// credentials, its TLS, its right to connect.
	errRefused
	// errConnLost: the driver's own word for a connection that broke
	// under it (MySQL's "invalid connection"), as a reset or an EOF is:
	// an outage only from a database that answered the store and whose
	// last word was no refusal (see isOutage).
	errConnLost
	// errAnswered: an error the database itself answered (a SQLSTATE, a
	// MySQL error number, a SQLite result code): it serves the store.
	errAnswered
)

// classify puts an error of the database in its class of the stores
// contract: an outage (stores.ErrUnavailable) only when it is known to be
// one (see isOutage), a refusal of the client (ErrRefused), data too
// large (stores.ErrTooLarge). Other errors are returned as they are:
// unclassified, a claim that fails with one is nacked under either
// policy.
func (s *Store) classify(err error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge) || errors.Is(err, ErrRefused):
		return err
	case s.is(err, errTooLarge):
		s.heard(err)
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	case s.refused(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case s.isOutage(err):
		s.heard(err)
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	case s.connLost(err):
		if r := s.refusal.Load(); r != nil {
			return fmt.Errorf("%w: %w (its last word to the store was a refusal: %s)", ErrRefused, err, *r)
		}
		if !s.answered.Load() {
			return fmt.Errorf("%w (a connection to a database that has not answered the store yet: not known to be an outage)", err)
		}
	}
	s.heard(err)
	return err
}

// is reports whether err belongs to class c, as the dialect classifies
// its server's errors; for errRetryable, also errRetry.
func (s *Store) is(err error, c errClass) bool {
	if err == nil {
		return false
	}
	if c == errRetryable && errors.Is(err, errRetry) {
		return true
	}
	return s.d.classify(err)&c != 0
}

// isOutage reports an error known to be an outage. Everything else is
// not known to be one, and a fail-open consumer must not run a handler
// through it unprotected: the database may be up, holding the record.
//
// Known outages: a dial refused, unreachable or timed out (the request
// never went out); a read or write that timed out, or found the network
// unreachable; a server that says it cannot serve now (the dialect's
// codes: shutting down, starting, out of connections, read-only after a
// failover); and a connection reset or closed (EOF, a bad or invalid
// connection) by a database that has answered this store before and
// whose last word was not a refusal of the client.
//
// A reset or an EOF alone says only that the server closed the
// connection, and that is also how a server turns a client away: a TLS
// 1.3 server refuses a client's certificate after the client's side of
// the handshake is done (go-sql-driver then reports an "invalid
// connection"), and a server may close the connection after a failed
// authentication. So from a database that never answered the store, or
// whose last word was a refusal, a reset is no outage.
func (s *Store) isOutage(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller's context ended: its own class, not an outage
		// (context.DeadlineExceeded is also a net.Error).
		return false
	}
	if s.is(err, errUnavailable) {
		return true
	}
	if s.connLost(err) {
		// Before the dial's own errors: a dial the server reset is no
		// dial refused.
		return s.answered.Load() && s.refusal.Load() == nil
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		// The request never went out: nothing listens, the host cannot
		// be reached, or the dial timed out. A name that does not
		// resolve is a setting to fix.
		var dns *net.DNSError
		return !errors.As(err, &dns) || !dns.IsNotFound
	}
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETDOWN)
}

// connLost reports a connection that broke under the client: reset,
// closed (EOF), or reported bad or invalid by the driver. Whether that is
// an outage depends on what the database said before (see isOutage).
func (s *Store) connLost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || s.is(err, errConnLost)
}

// refused reports, and notes, a refusal of the client: the database's
// own (the dialect's errRefused), or a TLS handshake that failed on
// either side: the server's alert (a certificate it does not accept, or
// none where it requires one, a TLS version or cipher it does not take),
// which crypto/tls returns as a *net.OpError (a net.Error); a server
// certificate the client does not trust; a server that does not speak
// TLS to a client that does.
func (s *Store) refused(err error) bool {
	if !s.is(err, errRefused) && !tlsRefused(err) {
		return false
	}
	msg := err.Error()
	s.refusal.Store(&msg)
	return true
}

// tlsRefused reports a TLS handshake that failed: the server's alert, the
// client's own (a local error), a server certificate that does not verify,
// a server that does not answer in TLS.
func tlsRefused(err error) bool {
	var (
		op     *net.OpError
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
		alert  tls.AlertError
		ua     x509.UnknownAuthorityError
		host   x509.HostnameError
		inv    x509.CertificateInvalidError
	)
	return (errors.As(err, &op) && (op.Op == "remote error" || op.Op == "local error")) ||
		errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert) ||
		errors.As(err, &ua) || errors.As(err, &host) || errors.As(err, &inv)
}

// heard notes that the database answered the store (a result, or an
// error it answered that is no refusal of the client): a reset from it
// again is an outage (see isOutage). err is the call's error, nil for a
// success.
func (s *Store) heard(err error) {
	if err != nil && !s.is(err, errAnswered) {
		return
	}
	if !s.answered.Load() {
		s.answered.Store(true)
	}
	if s.refusal.Load() != nil {
		s.refusal.Store(nil)
	}
}

// errRetry makes an operation start again: a record it saw vanished
// between two statements.
var errRetry = errors.New("sqlstore: record changed concurrently")

// errRollback rolls a transaction back without failing the operation.
var errRollback = errors.New("sqlstore: roll back")
