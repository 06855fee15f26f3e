package redisstore

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/neterr"
)

// Error classes: which errors of go-redis and Redis mean an outage
// (stores.ErrUnavailable), a refusal of the client (ErrRefused) or data
// too large (stores.ErrTooLarge). Everything else is unclassified: a
// claim that fails with it is nacked under either policy.

// ErrRefused is wrapped by the error of a call the Redis server refused
// the client for: its credentials (WRONGPASS, NOAUTH), its permissions
// (NOPERM: an ACL rule), its address (DENIED: protected mode), or its
// TLS (the server's alert refusing its certificate, none given where one
// is required; a server certificate the client does not trust; a client
// speaking TLS to a port that does not). It is never an outage: a
// consumer whose claims fail with it nacks under either policy, where an
// outage (stores.ErrUnavailable) would run its handler unprotected under
// FailOpen for as long as the settings stay wrong.
var ErrRefused = errors.New("redisstore: the Redis server refused the client")

// ErrNotReplicated is wrapped by the error of a Claim, Complete, Release
// or Extend whose write fewer than Config.WaitReplicas replicas
// acknowledged within Config.WaitTimeout (or whose WAIT failed), or
// whose deadline passed while the store waited for replicas. The write
// happened on the master (in the last case: if it went out before the
// deadline), and may not survive a failover: what it did is of unknown
// durability.
//
// It is a class of its own, not [stores.ErrUnavailable]: the store
// answered, and holds its records. A Claim that fails with it has
// given its claim back (best effort: a claim it cannot give back runs
// out with its lease), so no handler may run for it, and the
// middleware nacks it under either OnStoreError policy: FailOpen never
// runs a handler through it, since running the handler unprotected
// would give up the very durability asked for, and dedup with it. A
// Complete, Release or Extend that fails with it is retried by the
// middleware like any failure not known to be permanent (a retried
// Complete whose first attempt landed finds it done, is refused, and is
// reconciled, the refusal confirmed by WAIT as well).
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by Config.WaitReplicas replicas within WaitTimeout")

// classify is classifyCall for a call whose context the caller does not
// pass: a broken connection (see connLost) is not confirmed, and so is no
// known outage.
func classify(client redis.UniversalClient, err error) error {
	return class(err, func(err error) error {
		return fmt.Errorf("%w (not known to be an outage: the connection broke, and nothing confirmed why)", err)
	})
}

// classifyCall puts the error of a call made under ctx in its class of
// the stores contract: an outage (stores.ErrUnavailable) only when it is
// known to be one (see isOutage and confirmBroken), a refusal of the
// client (ErrRefused), data too large (stores.ErrTooLarge). Other errors are
// returned as they are, or with a word on why they are no known outage:
// unclassified, a claim that fails with one is nacked under either
// policy.
//
// Each error is classified on its own: the store keeps no memory of what
// a server said before. A reset or an EOF says only that the connection
// broke, not why: a server that crashed or was killed, a network that
// failed, and also a server turning the client away (a TLS 1.3 server
// refuses a client's certificate after the client's side of the
// handshake is done, and its close may overtake its alert, so that the
// client's first write meets a reset; a TLS-only port closes on a client
// speaking plain text, an EOF). go-redis does not tell a connection being
// set up from one in use, so confirmBroken dials a new connection: an
// outage only when that dial is refused or times out.
func classifyCall(ctx context.Context, client redis.UniversalClient, err error) error {
	return class(err, func(err error) error { return confirmBroken(ctx, client, err) })
}

// class puts err in its class, as classifyCall does, with confirm for a
// connection that broke.
func class(err error, confirm func(error) error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge) ||
		errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrRefused):
		return err
	case isTooLarge(err):
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	case isRefused(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case isOutage(err):
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	case !neterr.ConnLost(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return confirm(err)
}

// confirmBroken classifies err, a connection that broke under the client
// with no word of why (connLost), by dialing a new connection to the
// server the way the client does (its Dialer, its TLS) and sending it a
// PING,
// bounded by ctx, only ever on this error path: a dial refused,
// unreachable or timed out is a known outage; a refusal (the server's TLS
// alert, its certificate not trusted) a refusal; a reply (the server
// serves: the broken connection was one it closed, or one of a server
// that has since come back), or a connection taken and closed without a
// reply (a server that does not take the client: a TLS 1.3 refusal whose
// reset overtook the alert, a TLS-only port and a client speaking plain
// text; or a proxy in front of one that is down), is no known outage. A
// confirmation cut short by the end of ctx is that end: a call that
// outlived its deadline.
func confirmBroken(ctx context.Context, client redis.UniversalClient, err error) error {
	perr := probe(ctx, client, err)
	switch {
	case perr == nil:
		return fmt.Errorf("%w (not known to be an outage: the server answered a new connection since)", err)
	case errors.Is(perr, errNoProbe):
		return fmt.Errorf("%w (not known to be an outage: the connection broke, and %v)", err, perr)
	case isRefused(perr):
		return fmt.Errorf("%w: %w (a new connection was refused: %v)", ErrRefused, err, perr)
	case deadlinePassed(ctx):
		// The probe's read may time out at the call's deadline just
		// before ctx says it ended.
		return fmt.Errorf("%w (the call ended before a new connection told whether the server is down: %v)", cmp.Or(ctx.Err(), context.DeadlineExceeded), err)
	case isOutage(perr):
		return fmt.Errorf("%w: %w (a new connection failed too: %v)", stores.ErrUnavailable, err, perr)
	case neterr.ConnLost(perr):
		return fmt.Errorf("%w (not known to be an outage: the server took a new connection and closed it without a reply: %v)", err, perr)
	}
	return fmt.Errorf("%w (not known to be an outage: a new connection failed too, not as an outage: %v)", err, perr)
}

// errNoProbe: confirmBroken cannot tell which server to dial.
var errNoProbe = errors.New("the store cannot tell which server to dial to confirm it")

// probeTimeout bounds a probe whose call's context has no deadline
// earlier, when the client sets no dial timeout.
const probeTimeout = 5 * time.Second

// probe dials the server a call that failed with err used, as the client
// does, sends PING, and reads the first byte of the reply: nil when the
// server replied (whatever it replied: an error such as NOAUTH is a
// server that serves), else the error of the dial, the write or the
// read. Bounded by ctx, and by the client's dial timeout when ctx has no
// deadline.
func probe(ctx context.Context, client redis.UniversalClient, err error) error {
	dial, network, addr, timeout := dialerFor(client, err)
	if dial == nil {
		return errNoProbe
	}
	if timeout <= 0 {
		timeout = probeTimeout
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	type dialed struct {
		c   net.Conn
		err error
	}
	// go-redis's own dialer does the TLS handshake with
	// tls.DialWithDialer, bounded by its dial timeout and not by ctx.
	done := make(chan dialed, 1)
	go func() {
		c, err := dial(ctx, network, addr)
		done <- dialed{c, err}
	}()
	var d dialed
	select {
	case d = <-done:
	case <-ctx.Done():
		go func() {
			if d := <-done; d.c != nil {
				_ = d.c.Close()
			}
		}()
		return ctx.Err()
	}
	if d.err != nil {
		return d.err
	}
	c := d.c
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	b, err := bufio.NewReader(c).ReadByte()
	if err != nil {
		return err
	}
	if !strings.ContainsRune("+-:$*_#,(=%~>!|", rune(b)) {
		return fmt.Errorf("the server replied to PING with %q, not in the Redis protocol", b)
	}
	return nil
}

// dialerFor returns how the client dials the server a call that failed
// with err used: the client's dialer, network and address, and its dial
// timeout. A *redis.Client has one server (with Sentinel, its dialer
// finds the primary); for a Cluster or a Ring, the server is the one err
// names (a connection's remote address), and none when err names none.
func dialerFor(client redis.UniversalClient, err error) (dial func(context.Context, string, string) (net.Conn, error), network, addr string, timeout time.Duration) {
	var remote string
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		remote = op.Addr.String()
	}
	var tlsConfig *tls.Config
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		return o.Dialer, o.Network, o.Addr, o.DialTimeout
	case *redis.ClusterClient:
		o := c.Options()
		dial, tlsConfig, timeout = o.Dialer, o.TLSConfig, o.DialTimeout
	case *redis.Ring:
		o := c.Options()
		dial, tlsConfig, timeout = o.Dialer, o.TLSConfig, o.DialTimeout
	default:
		return nil, "", "", 0
	}
	if remote == "" {
		return nil, "", "", 0
	}
	if dial == nil {
		dial = redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: tlsConfig})
	}
	return dial, "tcp", remote, timeout
}

// isTooLarge reports the reply of a server to an argument longer than its
// proto-max-bulk-len: the only argument of the store's that can be long
// is a Complete's data. Redis then closes the connection. Server errors
// reach go-redis as text only, so the text is matched.
func isTooLarge(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "ERR Protocol error: invalid bulk length")
}

// isWriteRefused reports a server that refuses writes but serves reads:
// at its maxmemory (OOM), a replica (READONLY), failing to persist
// (MISCONF).
func isWriteRefused(err error) bool {
	return hasReplyPrefix(err, "OOM", "READONLY", "MISCONF")
}

// hasReplyPrefix reports a server's error reply whose text starts with
// one of prefixes.
func hasReplyPrefix(err error, prefixes ...string) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, p := range prefixes {
		if strings.HasPrefix(re.Error(), p) {
			return true
		}
	}
	return false
}

// unavailablePrefixes are the error replies of a Redis that cannot serve
// now: loading its dataset, a replica or a node without its primary, a
// cluster that is down or resharding, a script running too long, writes
// refused for lack of a successful save (a failing disk), too many
// clients. Not OOM: a Redis at its maxmemory is full, a setting to fix
// (as a NATS bucket at its limits is), not an outage a fail-open
// consumer may run through; the write is refused until records expire
// or maxmemory is raised.
var unavailablePrefixes = []string{
	"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS",
	"BUSY", "MISCONF", "ERR max number of clients",
}

// refusedPrefixes are the error replies of a Redis that refuses the
// client: its password or user (WRONGPASS, NOAUTH), an ACL rule
// (NOPERM), protected mode (DENIED).
var refusedPrefixes = []string{"WRONGPASS", "NOAUTH", "NOPERM", "DENIED"}

// isOutage reports an error known to be an outage by itself: a dial
// refused, unreachable or timed out (the request never went out; see
// neterr.DialOutage); a read or write that timed out, or found the network
// unreachable; no connection from the pool in time (go-redis's
// ErrPoolTimeout, ErrPoolExhausted); a server that replies it cannot
// serve now (unavailablePrefixes). A connection that broke (a reset, an
// EOF) is none by itself (see classifyCall). Everything else is not known
// to be one, and a fail-open consumer must not run a handler through it
// unprotected: the server may be up, holding the record.
func isOutage(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		return hasReplyPrefix(err, unavailablePrefixes...)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return neterr.DialOutage(err)
	}
	if neterr.ConnLost(err) || errors.Is(err, context.DeadlineExceeded) {
		// A broken connection, or a context's deadline (the caller's,
		// or one of go-redis's own): not known by itself.
		return false
	}
	return isTimeout(err) || neterr.Unreachable(err)
}

// isTimeout reports a timeout: a net.Error's, crypto/tls's handshake
// timeout among them.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isRefused reports a refusal of the client: the server's reply
// (refusedPrefixes), or a TLS handshake that failed on either side (see
// neterr.TLSRefused).
func isRefused(err error) bool {
	return hasReplyPrefix(err, refusedPrefixes...) || neterr.TLSRefused(err)
}

// isNoPerm reports an ACL refusal.
func isNoPerm(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOPERM")
}

// isRedisError reports an error a server answered.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// isSetNXGetRefused reports the reply of a Redis older than 7.0 to SET NX
// GET, "ERR syntax error" (HasErrorPrefix drops the "ERR "). Server errors
// reach go-redis as text only.
func isSetNXGetRefused(err error) bool {
	return redis.HasErrorPrefix(err, "syntax error")
}

// replicationError is an ErrNotReplicated that carries the ops giving
// back the claim whose write was not confirmed: the caller gives it back
// (see Store.giveBack), or, when the caller has gone, the batcher's
// orphan undo does.
type replicationError struct {
	msg  string
	undo []op
}

func (e *replicationError) Error() string { return e.msg }

func (e *replicationError) Unwrap() error { return ErrNotReplicated }

// undoOf returns the ops that give back the claim err failed, if err
// carries them.
func undoOf(err error) []op {
	var re *replicationError
	if errors.As(err, &re) {
		return re.undo
	}
	return nil
}
