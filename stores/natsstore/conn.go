package natsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"

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
//
// While no connection is up, the watcher also keeps the last refusal of
// the client the connection met (nats.go's LastError after a reconnect
// the server refused: its credentials, its TLS), until a connection is up
// again: a call made meanwhile fails with ErrRefused, not as an outage,
// even when the later attempts end in a reset or an EOF (a server that
// refused the client is not unavailable when it resets the next
// connection the same way). nats.go reports each failed attempt with a
// status event (RECONNECTING), its error already in LastError.
type connWatch struct {
	nc *nats.Conn
	ch chan nats.Status

	mu      sync.Mutex
	up      context.Context
	cancel  context.CancelCauseFunc
	gen     uint64
	refused error // the last refusal since a connection was last up

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
	var last error
	if st != nats.CONNECTED {
		last = w.nc.LastError()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up.Err() == nil && (st != nats.CONNECTED || gen != w.gen) {
		w.cancel(errConnLost)
	}
	if w.up.Err() != nil && st == nats.CONNECTED {
		w.up, w.cancel = context.WithCancelCause(context.Background())
		w.gen = gen
	}
	switch {
	case st == nats.CONNECTED:
		w.refused = nil
	case refusal(last):
		w.refused = last
	}
	return w.up
}

// current returns the up context, or, when no connection is up, an
// error: ErrRefused when the server refused the connection's last
// attempts (see connWatch), else ErrUnavailable.
func (w *connWatch) current() (context.Context, error) {
	up := w.sync()
	if up.Err() != nil {
		w.mu.Lock()
		refused := w.refused
		w.mu.Unlock()
		if refused != nil {
			return nil, fmt.Errorf("%w: the NATS connection is %s: the server refused it: %w", ErrRefused, w.nc.Status(), refused)
		}
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
