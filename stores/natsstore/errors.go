package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/neterr"
)

// Error classes: which errors of nats.go and JetStream mean an outage
// (stores.ErrUnavailable), a refusal of the client (ErrRefused), data
// too large (stores.ErrTooLarge) or a write that lost its
// compare-and-set.

// ErrRefused is wrapped by the error of a call made while the NATS
// server refuses the store's connection: its credentials (an
// authorization violation, credentials expired or revoked: a user removed
// at a config reload, say) or its TLS (a certificate either side does not
// trust, none given where one is required, TLS on one side only), at the
// connection's reconnect, or at Connect. Until the connection is up
// again, a call is taken for the same refusal, unless no server of the
// connection's pool can be reached at all (an outage). It is never an
// outage: a consumer whose claims fail with it nacks under either
// policy, where an outage (stores.ErrUnavailable) would run its handler
// unprotected under FailOpen for as long as the settings stay wrong.
var ErrRefused = errors.New("natsstore: the NATS server refused the client")

// ErrNotConnected is wrapped by the error of a call made while the
// store's NATS connection is not up (reconnecting, closed, draining), or
// cut short when it was lost, while a server of the connection's pool
// answers a new connection: a server that closed the session, as one
// does when it stops taking the client (its user removed at a config
// reload, its certificate no longer trusted) as well as when it restarts,
// until a reconnect attempt says which. It is no known outage: a
// consumer whose claims fail with it nacks under either policy. A call
// made while no server can be reached fails with stores.ErrUnavailable
// instead.
var ErrNotConnected = errors.New("natsstore: the NATS connection is not up")

// classify is the package's classify, with a closed store first, a call
// that timed out because the server denied the store a subject (see
// denied) before the caller's context, no responders from a bucket gone
// or an account without JetStream, and a call made on a connection that
// is not up, or cut short when it was lost (see connWatch.down).
func (s *Store) classify(ctx, cctx context.Context, err error) error {
	if err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
		if d := s.denied(cctx); d != nil {
			return fmt.Errorf("natsstore: %w (the user lacks a permission the store needs: see the Permissions section of natsstore's README); the call ended: %v", d, err)
		}
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)) {
		if gone := s.bucketGone(cctx); gone != nil {
			return fmt.Errorf("natsstore: %w (nothing answered the call: %v)", gone, err)
		}
	}
	lost := err != nil && cctx != nil && errors.Is(context.Cause(cctx), errConnLost)
	if err != nil && ctx.Err() == nil && s.watch != nil && !refusal(err) && !isTooLarge(err) && (lost || connDown(err)) {
		cause := err
		if lost {
			cause = fmt.Errorf("%w (%v)", errConnLost, err)
		}
		err = s.watch.down(ctx, cause)
	} else {
		err = classify(ctx, cctx, err)
	}
	if s.closed.Load() && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", stores.ErrClosed, err)
	}
	return err
}

// connDown reports an error of nats.go for a connection that is not up:
// no known outage by itself (see connWatch.down).
func connDown(err error) bool {
	for _, target := range []error{
		nats.ErrConnectionClosed, nats.ErrConnectionDraining, nats.ErrConnectionReconnecting,
		nats.ErrDisconnected, nats.ErrReconnectBufExceeded, nats.ErrStaleConnection,
		io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// denied returns the permissions violation the server reported for the
// call made under cctx (see callCtx): one naming a subject of the
// store's (a bucket's keys, its stream's JetStream API) or the replies'
// inbox, reported since the call began, or a subscription to the inbox
// refused since the connection was last up; else the connection's last
// error, when it is such a violation; else nil. The server answers a
// denied publish or subscription with nothing but that report: a request
// to a subject the user may not publish to, or whose reply it may not
// receive, just times out, which would otherwise pass for an outage, the
// one class a fail-open consumer runs its handler through unprotected.
// The store sees every report through the connection's error handler,
// which it wraps (see violationWatch): the application's own violations
// on a shared connection, which replace LastError, do not hide it.
func (s *Store) denied(cctx context.Context) error {
	if s.violations != nil {
		since := uint64(0)
		c, ok := cctx.(*callContext)
		if ok {
			since = c.violations
		}
		if err := s.violations.deniedSince(s.nc, since, ok); err != nil {
			return err
		}
	}
	err := s.nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) || !s.namesStoreSubject(err.Error()) {
		return nil
	}
	return err
}

// namesStoreSubject reports a permissions violation (its text) that
// names a subject of the store's, or the replies' inbox.
func (s *Store) namesStoreSubject(msg string) bool {
	inbox := s.nc.Opts.InboxPrefix
	if inbox == "" {
		inbox = nats.InboxPrefix
	}
	if strings.Contains(msg, "Subscription to \""+strings.TrimSuffix(inbox, ".")) {
		return true
	}
	for _, b := range s.cfg.Buckets() {
		stream := streamName(b)
		if strings.Contains(msg, subjectPrefix(b)) || strings.Contains(msg, stream+"\"") || strings.Contains(msg, stream+".") {
			return true
		}
	}
	return false
}

// bucketGone tells a call that nothing answered (no responders) because
// one of the store's buckets is gone (its stream deleted: a setting to
// fix, not an outage, and until it is fixed every call finds nothing
// there), or because the connection's account has no JetStream (its user
// moved to another account: the same), from one that met a stream
// without a leader (an election, an outage): it asks JetStream for the
// streams' info, and returns an error wrapping jetstream.ErrBucketNotFound
// naming the first bucket whose stream JetStream says does not exist, or
// jetstream.ErrJetStreamNotEnabledForAccount when JetStream says the
// account has none (10039), or nil when every one exists or JetStream
// does not answer (then the call's error is an outage).
func (s *Store) bucketGone(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	for _, b := range s.cfg.Buckets() {
		_, err := s.js.Stream(ctx, streamName(b))
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return fmt.Errorf("%w: bucket %q: its stream %s does not exist (deleted?): create it again (natsstore.New creates a missing bucket), or point the store at the right one: %w", jetstream.ErrBucketNotFound, b, streamName(b), err)
		case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return fmt.Errorf("%w: the account of the connection's user has no JetStream, so no bucket %q (a user moved to another account?): %w", jetstream.ErrJetStreamNotEnabledForAccount, b, err)
		}
	}
	return nil
}

// classify puts err, from I/O made under cctx (see callCtx) for a caller
// whose context is ctx, into its class of the stores contract.
func classify(ctx, cctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		// The caller's context ended: its class, whatever else failed.
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	if errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge) || errors.Is(err, ErrRefused) {
		return err
	}
	if refusal(err) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if isTooLarge(err) {
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	}
	if isUnavailable(err) {
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	}
	return err
}

// unavailableErrs are the nats.go and jetstream errors of a server that
// cannot be reached or cannot serve now. A connection that is not up
// (closed, draining, reconnecting, lost) is none by itself
// (Store.classify asks connWatch.down); nor is a reset or an EOF.
var unavailableErrs = []error{
	nats.ErrTimeout, nats.ErrNoResponders, nats.ErrNoServers, nats.ErrMaxConnectionsExceeded,
	jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, jetstream.ErrServerShutdown,
	// The caller's context is alive (classify checked): a deadline that
	// passed is the client's own request timeout.
	context.DeadlineExceeded,
}

// unavailableCodes are JetStream API error codes of a system that cannot
// serve now: no meta leader or quorum, a stream without a leader, a
// server out of resources.
var unavailableCodes = map[jetstream.ErrorCode]bool{
	10008: true, // JetStream system temporarily unavailable
	10023: true, // insufficient resources
	10076: true, // JetStream not enabled (a server starting)
	10118: true, // stream is offline
}

// refusal reports an error by which the server refused the client: its
// credentials, or its TLS either way (the server's alert, which
// crypto/tls returns as a *net.OpError, a net.Error; a server
// certificate the client does not trust; TLS on one side only; a
// connection nats.go saw closed right after the TLS handshake, which is
// how a server refuses a client's certificate under TLS 1.3: ErrTLS).
// It is never an outage.
func refusal(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrTLS) {
		// nats.go's wrap of every failed TLS handshake, and of a
		// connection closed right after one: a refusal, but for a
		// handshake that timed out (a server that does not answer).
		var ne net.Error
		return !errors.As(err, &ne) || !ne.Timeout()
	}
	for _, target := range []error{
		nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrSecureConnRequired, nats.ErrSecureConnWanted,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return neterr.TLSRefused(err)
}

// isUnavailable reports an error that means NATS could not be reached or
// could not serve the call now. A refusal of the client (see refusal)
// is none, even when it is a net.Error.
func isUnavailable(err error) bool {
	if refusal(err) {
		return false
	}
	for _, target := range unavailableErrs {
		if errors.Is(err, target) {
			return true
		}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return neterr.DialOutage(err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		if ae.ErrorCode == jsErrCodeStoreLimit || ae.ErrorCode == jetstream.JSErrCodeJetStreamNotEnabledForAccount {
			// A bucket at its configured MaxMsgs or MaxBytes (discard-new),
			// an account without JetStream, answer 503 too, but that is a
			// setting to fix, not an outage a fail-open consumer may run
			// through.
			return false
		}
		return ae.Code == 503 || unavailableCodes[ae.ErrorCode]
	}
	return false
}

// isTooLarge reports a message refused for its size: by the client,
// larger than the server's maximum payload (which a reconnect may have
// lowered since the store was built), or by the stream, larger than its
// largest message (a bucket's MaxValueSize).
func isTooLarge(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		(errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum)
}

// jsErrCodeStoreLimit is JetStream's error code for a write refused by a
// stream limit ("maximum messages exceeded", "maximum bytes exceeded").
const jsErrCodeStoreLimit jetstream.ErrorCode = 10077

// isConflict reports a write refused because the key's last revision was
// not the one it expected: someone wrote the key in between.
func isConflict(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) &&
		(ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
