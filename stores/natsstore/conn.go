package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
)

// errConnLost cancels the calls in flight when the connection to NATS is
// lost: nats.go would let a request whose connection dropped wait for
// its reply until the caller's deadline, and buffer new ones while it
// reconnects. The store fails them at once, as outages, instead.
var errConnLost = errors.New("natsstore: connection to NATS lost")

// connWatch follows the state of the connection. up is a context that
// is cancelled (with errConnLost) as soon as the connection it was made
// for is lost, and replaced by a new one once a connection is up again;
// every call runs under a context that ends with it.
//
// A connection is told from the next by nats.go's count of reconnects:
// up belongs to the connection of count gen. The watcher syncs on every
// status event, and every call syncs before its I/O: a disconnection
// (even one nats.go already recovered from, its events still queued)
// cancels up, and an event that arrives late cancels nothing made after
// it.
type connWatch struct {
	nc *nats.Conn
	ch chan nats.Status

	mu     sync.Mutex
	up     context.Context
	cancel context.CancelCauseFunc
	gen    uint64

	done chan struct{}
}

func newConnWatch(nc *nats.Conn) *connWatch {
	w := &connWatch{nc: nc, done: make(chan struct{})}
	w.up, w.cancel = context.WithCancelCause(context.Background())
	w.cancel(errConnLost) // sync makes the first one
	w.ch = nc.StatusChanged()
	w.sync()
	go w.run()
	return w
}

func (w *connWatch) run() {
	defer close(w.done)
	for range w.ch {
		w.sync()
	}
}

// state returns the connection's status and its count of reconnects, read
// together.
func (w *connWatch) state() (nats.Status, uint64) {
	for {
		gen := w.nc.Stats().Reconnects
		st := w.nc.Status()
		if w.nc.Stats().Reconnects == gen {
			return st, gen
		}
	}
}

// sync brings up in line with the connection and returns it: cancelled
// when the connection it was made for is gone (or none is up), new when
// a connection is up and the last one was cancelled.
func (w *connWatch) sync() context.Context {
	st, gen := w.state()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up.Err() == nil && (st != nats.CONNECTED || gen != w.gen) {
		w.cancel(errConnLost)
	}
	if w.up.Err() != nil && st == nats.CONNECTED {
		w.up, w.cancel = context.WithCancelCause(context.Background())
		w.gen = gen
	}
	return w.up
}

// current returns the up context, or an ErrUnavailable error when no
// connection is up.
func (w *connWatch) current() (context.Context, error) {
	up := w.sync()
	if up.Err() != nil {
		return nil, fmt.Errorf("%w: the NATS connection is %s", stores.ErrUnavailable, w.nc.Status())
	}
	return up, nil
}

// stop ends the watcher and waits for it (briefly: it only updates a
// context per event).
func (w *connWatch) stop() {
	w.nc.RemoveStatusListener(w.ch)
	<-w.done
	w.mu.Lock()
	w.cancel(errConnLost)
	w.mu.Unlock()
}

// callCtx returns the context one call's I/O runs under: ctx, also
// cancelled when the connection is lost. release must be called when
// the call is over.
func (w *connWatch) callCtx(ctx context.Context) (cctx context.Context, release func(), err error) {
	up, err := w.current()
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(up, func() { cancel(errConnLost) })
	return cctx, func() { stop(); cancel(nil) }, nil
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
	if errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge) {
		return err
	}
	if isTooLarge(err) {
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	}
	if cctx != nil && errors.Is(context.Cause(cctx), errConnLost) {
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, errConnLost)
	}
	if isUnavailable(err) {
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	}
	return err
}

// unavailableErrs are the nats.go and jetstream errors of a server that
// cannot be reached or cannot serve now.
var unavailableErrs = []error{
	nats.ErrConnectionClosed, nats.ErrConnectionDraining, nats.ErrConnectionReconnecting,
	nats.ErrDisconnected, nats.ErrTimeout, nats.ErrNoResponders, nats.ErrNoServers,
	nats.ErrReconnectBufExceeded, nats.ErrStaleConnection, nats.ErrMaxConnectionsExceeded,
	nats.ErrInvalidConnection,
	jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, jetstream.ErrServerShutdown,
	// The caller's context is alive (classify checked): a deadline that
	// passed is the client's own request timeout.
	context.DeadlineExceeded,
	io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
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

// isUnavailable reports an error that means NATS could not be reached or
// could not serve the call now.
func isUnavailable(err error) bool {
	for _, target := range unavailableErrs {
		if errors.Is(err, target) {
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		if ae.ErrorCode == jsErrCodeStoreLimit {
			// A bucket at its configured MaxMsgs or MaxBytes (discard-new)
			// answers 503 too, but that is a setting to fix, not an
			// outage a fail-open consumer may run through.
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
