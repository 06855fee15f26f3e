package natsstore

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// The permissions violations the server reports on a connection. A
// denied publish or subscription gets no answer but that report, sent to
// the connection's async error handler and kept as its LastError: a
// single error, which the application's own violations on a shared
// connection replace. So each store wraps the connection's error handler
// when it is made (the handler set before, nats.go's default or the
// application's, still gets every error, after the store's look) and
// keeps the last violation that names its subjects. A closed store's
// wrapper only passes the errors on. A handler the application sets
// later with SetErrorHandler replaces the stores' (unless it calls the
// one it replaces): they then see LastError alone.

// violationWatch is a store's view of its connection's violations.
type violationWatch struct {
	match   func(msg string) bool // names the store's subjects
	stopped atomic.Bool
	seq     atomic.Uint64 // violations matched so far

	mu   sync.Mutex
	last error // the last violation matched
	// sub is the last subscription the server refused the store (its
	// replies' inbox), and gen the connection's count of reconnects
	// then: a refused subscription stays refused on that connection.
	sub error
	gen uint64
}

// watchViolations has the store, whose subjects match tells, see nc's
// violations from now on: it wraps nc's error handler.
func watchViolations(nc *nats.Conn, match func(string) bool) *violationWatch {
	w := &violationWatch{match: match}
	next := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if !w.stopped.Load() {
			w.note(c, err)
		}
		if next != nil {
			next(c, sub, err)
		}
	})
	return w
}

// stop ends w: its wrapper passes the errors on and looks at none.
func (w *violationWatch) stop() { w.stopped.Store(true) }

// note records err when it is a permissions violation naming the
// store's subjects.
func (w *violationWatch) note(nc *nats.Conn, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	msg := err.Error()
	if !w.match(msg) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = err
	if strings.Contains(strings.ToLower(msg), "subscription to") {
		w.sub, w.gen = err, nc.Stats().Reconnects
	}
	w.seq.Add(1)
}

// now is the count of violations matched so far: a call notes it before
// its I/O.
func (w *violationWatch) now() uint64 { return w.seq.Load() }

// deniedSince returns the violation naming the store's subjects matched
// after the count since (when known), or a subscription refused on the
// connection still up; nil for none.
func (w *violationWatch) deniedSince(nc *nats.Conn, since uint64, known bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case known && w.seq.Load() > since:
		return w.last
	case w.sub != nil && w.gen == nc.Stats().Reconnects && nc.IsConnected():
		return w.sub
	}
	return nil
}
