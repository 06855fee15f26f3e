package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"

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

// errClass is the set of classes an error belongs to, for the store.
type errClass uint8

const (
	// errUnavailable: the database could not be reached, or said it
	// cannot serve now (stores.ErrUnavailable).
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
)

// classify marks an error of a database that cannot be reached, or says
// it cannot serve now, with stores.ErrUnavailable (the outage class of the
// stores contract). Other errors are returned as they are.
func (s *Store) classify(err error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge):
		return err
	case s.is(err, errTooLarge):
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	case s.is(err, errUnavailable):
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	}
	return err
}

// is reports whether err belongs to class c: the failures every driver
// shares, then the dialect's own.
func (s *Store) is(err error, c errClass) bool {
	if err == nil {
		return false
	}
	switch c {
	case errUnavailable:
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// The caller's context ended: its own class, not an outage
			// (context.DeadlineExceeded is also a net.Error).
			return false
		}
		if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
			return true
		}
		var ne net.Error
		if errors.As(err, &ne) {
			return true
		}
	case errRetryable:
		if errors.Is(err, errRetry) {
			return true
		}
	}
	return s.d.classify(err)&c != 0
}

// errRetry makes an operation start again: a record it saw vanished
// between two statements.
var errRetry = errors.New("sqlstore: record changed concurrently")

// errRollback rolls a transaction back without failing the operation.
var errRollback = errors.New("sqlstore: roll back")
