package natsstore

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/nats-io/nats.go"
)

// The permissions violations the server reports on a connection. A
// denied publish or subscription gets no answer but that report, sent to
// the connection's async error handler and kept as its LastError: a
// single error, which the application's own violations on a shared
// connection replace. So the first store made on a connection wraps its
// error handler (the handler set before, nats.go's default or the
// application's, still gets every error, after the store's look), once
// for all the stores on it; each store keeps the last violation naming
// its subjects, and stops looking when it is closed. A handler the
// application sets later with SetErrorHandler replaces the wrapper
// (unless it calls the one it replaces): the stores then see LastError
// alone.
//
// The wrappers are found by connection in a table of the package, which
// holds each connection weakly (its entry goes with it): nats.Conn has
// no room for a value of ours, and a wrapper per store would stack up
// on a connection that outlives its stores, and could be lost when two
// stores are made at once (reading and setting the handler are two
// calls).

// connViolations is the log of one connection's violations, shared by
// the stores on it. Its method handle is the connection's error handler.
type connViolations struct {
	mu       sync.Mutex
	watchers map[*violationWatch]struct{}
	next     nats.ErrHandler // the handler handle wraps
}

// violationWatch is a store's view of its connection's violations.
type violationWatch struct {
	log   *connViolations
	match func(msg string) bool // names the store's subjects
	seq   atomic.Uint64         // violations matched so far

	mu   sync.Mutex
	last error // the last violation matched
	// sub is the last subscription the server refused the store (its
	// replies' inbox), and gen the connection's count of reconnects
	// then: a refused subscription stays refused on that connection.
	sub error
	gen uint64
}

// violationLogs maps a connection (weakly) to its log.
var violationLogs sync.Map // weak.Pointer[nats.Conn] -> *connViolations

// watchViolations has the store, whose subjects match tells, see nc's
// violations from now on.
func watchViolations(nc *nats.Conn, match func(string) bool) *violationWatch {
	key := weak.Make(nc)
	v, loaded := violationLogs.LoadOrStore(key, &connViolations{watchers: map[*violationWatch]struct{}{}})
	log := v.(*connViolations)
	if !loaded {
		runtime.AddCleanup(nc, func(k weak.Pointer[nats.Conn]) { violationLogs.Delete(k) }, key)
		log.mu.Lock()
		log.next = nc.ErrorHandler()
		nc.SetErrorHandler(log.handle)
		log.mu.Unlock()
	}
	w := &violationWatch{log: log, match: match}
	log.mu.Lock()
	log.watchers[w] = struct{}{}
	log.mu.Unlock()
	return w
}

// stop ends w: the store no longer looks at the connection's errors.
func (w *violationWatch) stop() {
	w.log.mu.Lock()
	delete(w.log.watchers, w)
	w.log.mu.Unlock()
}

// handle notes err in the watches, then hands it to the handler it
// wraps.
func (l *connViolations) handle(nc *nats.Conn, sub *nats.Subscription, err error) {
	l.mu.Lock()
	next := l.next
	if errors.Is(err, nats.ErrPermissionViolation) {
		for w := range l.watchers {
			w.note(nc, err)
		}
	}
	l.mu.Unlock()
	if next != nil {
		next(nc, sub, err)
	}
}

// note records err, a permissions violation, when it names the store's
// subjects.
func (w *violationWatch) note(nc *nats.Conn, err error) {
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
