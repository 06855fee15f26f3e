package natsstore

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestViolationWatch: the store sees every permissions violation the
// server reports on its connection through the error handler it wraps
// (the application's still gets each one), keeps the last one naming its
// subjects, and tells it from the application's own that came after;
// the stores on one connection, made one after the other or at once,
// wrap it once, and a closed one no longer looks.
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

	// A second store on the connection: the handler is wrapped once (the
	// application's handler gets each error once), and each store sees
	// the violation.
	w2 := watchViolations(nc, ours)
	since, since2 := w.now(), w2.now()
	nc.ErrorHandler()(nc, nil, store)
	if got := w2.deniedSince(nc, since2, true); !errors.Is(got, store) || len(app) != 4 || w.now() != since+1 {
		t.Fatalf("a second store: deniedSince = %v, the application's handler got %d errors, the first store counted %d; want the violation, 4, 1", got, len(app), w.now()-since)
	}
	// A closed store no longer looks, and nothing is wrapped again.
	w2.stop()
	since, since2 = w.now(), w2.now()
	nc.ErrorHandler()(nc, nil, store)
	if w2.now() != since2 || w.now() != since+1 || len(app) != 5 {
		t.Fatalf("after the second store closed: it counted %d, the first %d, the application got %d errors; want 0, 1, 5", w2.now()-since2, w.now()-since, len(app))
	}
	// Many stores made at once on one connection: every one sees the
	// violations, and the handler is wrapped once.
	var many [64]*violationWatch
	var wg sync.WaitGroup
	for i := range many {
		wg.Go(func() { many[i] = watchViolations(nc, ours) })
	}
	wg.Wait()
	nc.ErrorHandler()(nc, nil, store)
	for i, m := range many {
		if m.now() != 1 {
			t.Fatalf("store %d of %d made at once counted %d violations, want 1", i, len(many), m.now())
		}
		m.stop()
	}
	if len(app) != 6 {
		t.Fatalf("the application's handler got %d errors, want 6: wrapped more than once", len(app))
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
