package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/neterr"
)

// Error classes: what the store does with an error (report an outage,
// retry, report a dead joined transaction or data too large), each
// dialect classifying its own server's errors, and the classifier that
// puts an error of the database in its class of the stores contract.

// ErrSessionSettings is returned by every call on a database whose session
// settings break an assumption of the store: MySQL's autocommit off
// (autocommit=0 in the DSN), under which the store's single statements
// open transactions nobody commits. Fix the DSN; the error names the
// setting. It is checked once, at the first call that reaches the
// database.
var ErrSessionSettings = errors.New("a database session setting breaks the store")

// ErrRefused is wrapped by the error of a database that refused the
// store's client: its credentials (a wrong password, a role or user the
// server does not let in from there, an account locked or over a limit
// its administrator set), its TLS (a certificate either side does not
// trust, none given where one is required, TLS on one side only), its
// right to connect to the database. It is never an outage: a consumer
// whose claims fail with it nacks under either policy, where an outage
// (stores.ErrUnavailable) would run its handler unprotected under
// FailOpen for as long as the settings stay wrong.
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
	// no word of why (see classify).
	errConnLost
	// errConnecting: the error of a connection that could not be set up
	// (pgx's ConnectError: the dial, TLS, the startup, the
	// authentication), and not of a statement on a connection the
	// database had taken.
	errConnecting
)

// classifier classifies the errors of a store's database: db is the pool
// a confirmation calls on (see confirm), d the dialect, which tells its
// server's errors (see errClass). The Store makes one per error.
type classifier struct {
	db *sql.DB
	d  interface{ classify(err error) errClass }
}

// classify puts an error of the database, from a call made under ctx, in
// its class of the stores contract: an outage (stores.ErrUnavailable)
// only when it is known to be one (see isOutage and confirm), a refusal
// of the client (ErrRefused), data too large (stores.ErrTooLarge). Other
// errors are returned as they are, or with a word on why they are no
// known outage: unclassified, a claim that fails with one is nacked under
// either policy.
//
// A reset, an EOF, a bad or invalid connection says only that the
// connection broke, not why: a server that crashed or was killed, a
// network that failed, and also a server turning the client away (a TLS
// 1.3 server refuses a client's certificate after the client's side of
// the handshake, and its close may overtake its alert; go-sql-driver
// reports any of them as "invalid connection"). When the driver tells
// that it broke while it was being set up (pgx's ConnectError), the
// dial had succeeded: a server that is up and does not take the client,
// or a balancer in front of one that is down, never a known outage.
// Otherwise confirm asks a new connection of the pool: an outage only
// when its dial is refused or times out.
func (cl classifier) classify(ctx context.Context, err error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge) || errors.Is(err, ErrRefused):
		return err
	case cl.is(err, errTooLarge):
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	case cl.refused(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case cl.isOutage(err):
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	case !cl.connLost(err):
		return err
	case cl.is(err, errConnecting):
		return fmt.Errorf("%w (not known to be an outage: the connection broke while it was being set up, after its dial succeeded)", err)
	}
	return cl.confirm(ctx, err)
}

// confirm classifies err, a connection that broke under the client with
// no word of why (connLost), by a new call on a connection of the pool
// (db.Conn and a ping, bounded by ctx), only ever on this error path: a
// dial refused, unreachable or timed out, or the server's word that it
// cannot serve now, is a known outage; a refusal of the client a
// refusal; a connection set up and lost again, or a ping answered (the
// database serves: the broken connection was one of its own, killed or
// timed out, or one of a server that has since come back), is no known
// outage, and so is any other failure of it. A confirmation cut short by
// the end of ctx is that end: a call that outlived its deadline.
func (cl classifier) confirm(ctx context.Context, err error) error {
	var perr error
	for attempt := 0; attempt < 2; attempt++ {
		if perr = cl.probe(ctx); perr == nil || !cl.connLost(perr) || cl.is(perr, errConnecting) {
			break
		}
		// The ping met a broken connection of the pool (discarded now):
		// once more, on another.
	}
	switch {
	case perr == nil:
		return fmt.Errorf("%w (not known to be an outage: the database answered a new call since)", err)
	case errors.Is(perr, errNoConfirm):
		return fmt.Errorf("%w (not known to be an outage: %v)", err, perr)
	case ctx.Err() != nil:
		return fmt.Errorf("%w (the call ended before a new connection told whether the database is down: %v)", ctx.Err(), err)
	case cl.refused(perr):
		return fmt.Errorf("%w: %w (a new connection was refused: %v)", ErrRefused, err, perr)
	case cl.isOutage(perr):
		return fmt.Errorf("%w: %w (a new connection failed too: %v)", stores.ErrUnavailable, err, perr)
	}
	return fmt.Errorf("%w (not known to be an outage: a new call on a connection of the pool failed too, not as an outage: %v)", err, perr)
}

// errNoConfirm is a confirmation that got no connection of the pool to
// make its call on.
var errNoConfirm = errors.New("no connection of the pool to confirm it with")

// confirmWait bounds a confirmation's wait for a connection of the pool.
const confirmWait = 5 * time.Second

// probe makes a call on a connection of the pool: an idle one, checked
// by the driver before use, or a new one. It does not wait for one the
// pool has not got, since the connections in use may be the caller's own
// (a joined transaction) or stuck on the same broken network; nor, should
// another call take the last one first, or its dial not end, longer than
// confirmWait.
func (cl classifier) probe(ctx context.Context) error {
	if st := cl.db.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return fmt.Errorf("%w: all %d are in use", errNoConfirm, st.MaxOpenConnections)
	}
	wctx, cancel := context.WithTimeout(ctx, confirmWait)
	defer cancel()
	c, err := cl.db.Conn(wctx)
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return fmt.Errorf("%w: none within %s (%v)", errNoConfirm, confirmWait, err)
		}
		return err
	}
	defer c.Close()
	return c.PingContext(ctx)
}

// is reports whether err belongs to class c, as the dialect classifies
// its server's errors; for errRetryable, also errRetry.
func (cl classifier) is(err error, c errClass) bool {
	if err == nil {
		return false
	}
	if c == errRetryable && errors.Is(err, errRetry) {
		return true
	}
	return cl.d.classify(err)&c != 0
}

// isOutage reports an error known to be an outage by itself: a dial
// refused, unreachable or timed out (the request never went out; see
// neterr.DialOutage); a read or write that timed out, or found the network
// unreachable; a server that says it cannot serve now (the dialect's
// codes: shutting down, starting, out of connections, read-only after a
// failover). A connection that broke (a reset, an EOF) is none by itself
// (see classify). Everything else is not known to be one, and a fail-open
// consumer must not run a handler through it unprotected: the database
// may be up, holding the record.
func (cl classifier) isOutage(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller's context ended: its own class, not an outage
		// (context.DeadlineExceeded is also a net.Error).
		return false
	}
	if cl.is(err, errUnavailable) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return neterr.DialOutage(err)
	}
	if cl.connLost(err) {
		return false
	}
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || neterr.Unreachable(err)
}

// connLost reports a connection that broke under the client: reset,
// closed (EOF), or reported bad or invalid by the driver. Whether that is
// an outage is for classify to find out.
func (cl classifier) connLost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || neterr.ConnLost(err) || cl.is(err, errConnLost)
}

// refused reports a refusal of the client: the database's own (the
// dialect's errRefused), or a TLS handshake that failed on either side:
// the server's alert (a certificate it does not accept, or none where it
// requires one, a TLS version or cipher it does not take), which
// crypto/tls returns as a *net.OpError (a net.Error); a server
// certificate the client does not trust; a server that does not speak
// TLS to a client that does.
func (cl classifier) refused(err error) bool {
	return cl.is(err, errRefused) || neterr.TLSRefused(err)
}

// errRetry makes an operation start again: a record it saw vanished
// between two statements.
var errRetry = errors.New("sqlstore: record changed concurrently")
