package natsstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestViolationWatch: the store sees every permissions violation the
// server reports on its connection through the error handler it wraps
// (the application's still gets each one), keeps the last one naming its
// subjects, and tells it from the application's own that came after;
// each store on the connection wraps it, and a closed one only passes
// the errors on.
func TestViolationWatch(t *testing.T) {
	nc := &nats.Conn{}
	var app []error
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { app = append(app, err) })
	ours := func(msg string) bool { return strings.Contains(msg, `"$KV.b.`) }
	w := watchViolations(nc, ours)
	defer w.stop()
	violation := func(subject string) error {
		return fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subject)
	}
	store, own := violation("$KV.b.k"), violation("orders.created")

	since := w.now()
	nc.ErrorHandler()(nc, nil, store)
	nc.ErrorHandler()(nc, nil, own)
	nc.ErrorHandler()(nc, nil, errors.New("nats: slow consumer"))
	if got := w.deniedSince(nc, since, true); !errors.Is(got, store) {
		t.Fatalf("deniedSince the call began = %v, want the store's violation %v", got, store)
	}
	if len(app) != 3 {
		t.Fatalf("the application's handler got %d errors, want 3", len(app))
	}
	if got := w.deniedSince(nc, w.now(), true); got != nil {
		t.Fatalf("deniedSince now = %v, want none", got)
	}

	// A second store on the connection wraps the handler again: each
	// store sees the violation, the application's handler gets it once.
	w2 := watchViolations(nc, ours)
	defer w2.stop()
	since, since2 := w.now(), w2.now()
	nc.ErrorHandler()(nc, nil, store)
	if got := w2.deniedSince(nc, since2, true); !errors.Is(got, store) || len(app) != 4 || w.now() != since+1 {
		t.Fatalf("a second store: deniedSince = %v, the application's handler got %d errors, the first store counted %d; want the violation, 4, 1", got, len(app), w.now()-since)
	}
	// A closed store's wrapper passes the errors on and notes none.
	w2.stop()
	since, since2 = w.now(), w2.now()
	nc.ErrorHandler()(nc, nil, store)
	if w2.now() != since2 || w.now() != since+1 || len(app) != 5 {
		t.Fatalf("after the second store closed: it counted %d, the first %d, the application got %d errors; want 0, 1, 5", w2.now()-since2, w.now()-since, len(app))
	}
	// A refused subscription to the replies' inbox stays refused on the
	// connection (which is not up here: no longer).
	sub := fmt.Errorf("%w: Permissions Violation for Subscription to %q", nats.ErrPermissionViolation, "_INBOX.x.*")
	inbox := watchViolations(nc, func(msg string) bool { return strings.Contains(msg, "_INBOX") })
	defer inbox.stop()
	nc.ErrorHandler()(nc, nil, sub)
	if got := inbox.deniedSince(nc, inbox.now(), true); got != nil {
		t.Fatalf("a subscription refused on a connection no longer up = %v, want none", got)
	}
}
