// Package keytest runs the routers of the key packages' tests: a
// Watermill router consuming one topic through the dedup middleware, as
// a service consuming another producer's messages does.
package keytest

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Run starts a router consuming topic from sub through the dedup
// middleware configured by cfg (on a memstore of its own when cfg.Store
// is nil), into handler. observe, when set, sees every delivery outermost,
// duplicates included, with the error the router nacks it for (nil: it is
// acked). Run returns once the router runs; the router, the subscriber
// and the store stop when t ends.
func Run(t testing.TB, sub message.Subscriber, topic string, cfg middleware.Config, observe func(msg *message.Message, err error), handler message.NoPublishHandlerFunc) {
	t.Helper()
	if cfg.Store == nil {
		store, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(context.Background()) })
		cfg.Store = store
	}
	mw, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if observe != nil {
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				observe(msg, err)
				return out, err
			}
		})
	}
	router.AddMiddleware(mw.Middleware)
	router.AddNoPublisherHandler("keytest", topic, sub, handler)
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close(); <-done })
	<-router.Running()
}

// Await receives n values from ch, failing t when the hang guard (five
// minutes, far beyond any expected wait: a guard against a hang, not a
// time budget) passes first.
func Await[T any](t testing.TB, ch <-chan T, n int) []T {
	t.Helper()
	guard := time.NewTimer(5 * time.Minute)
	defer guard.Stop()
	out := make([]T, 0, n)
	for len(out) < n {
		select {
		case v := <-ch:
			out = append(out, v)
		case <-guard.C:
			t.Fatalf("%d of %d awaited deliveries before the hang guard", len(out), n)
		}
	}
	return out
}

// Count runs a router (Run, with the middleware's default key) until n
// deliveries were acked, and returns the handler's runs by message UUID
// and the keys key gave the acked deliveries (failing t for one it gives
// none). check, when set, is called on every message the handler gets.
func Count(t testing.TB, sub message.Subscriber, topic string, n int, key keyfuncs.KeyFunc, check func(msg *message.Message)) (runs map[string]int, keys map[string]bool) {
	t.Helper()
	var mu sync.Mutex
	runs, keys = map[string]int{}, map[string]bool{}
	acked := make(chan struct{}, n+64)
	Run(t, sub, topic, middleware.Config{}, func(msg *message.Message, err error) {
		if err != nil {
			return
		}
		k, kerr := key(msg)
		mu.Lock()
		for _, v := range k {
			keys[v] = true
		}
		mu.Unlock()
		if kerr != nil {
			t.Errorf("key of message %s: %v", msg.UUID, kerr)
		}
		acked <- struct{}{}
	}, func(msg *message.Message) error {
		if check != nil {
			check(msg)
		}
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		return nil
	})
	Await(t, acked, n)
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(runs), maps.Clone(keys)
}

// OffsetWithoutARow checks that offset (the sqlkeys major's Offset) fails
// with keyfuncs.ErrNoKey on a message no subscriber read from a row.
func OffsetWithoutARow(t testing.TB, offset keyfuncs.KeyFunc) {
	t.Helper()
	msg := message.NewMessage("m-1", nil)
	if _, err := offset(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("Offset() outside a router = %v, want ErrNoKey", err)
	}
}

// ForeignRows is a foreign producer writing a watermill-sql topic with
// plain SQL, then the router reading it: insert (its uuid, payload and
// metadata placeholders in order, the table filled in) runs for one event
// twice under its own id (a retried INSERT) and once for a row under a
// fresh id. The middleware's default key must run the first event once,
// the row's metadata must reach the handler, and offset (the sqlkeys
// major's Offset) must key every row apart, as topic/<offset>.
func ForeignRows(t testing.TB, db *sql.DB, insert string, sub message.Subscriber, topic string, offset keyfuncs.KeyFunc) {
	t.Helper()
	for _, id := range []string{"pay-42", "pay-42", storetest.NewID()} {
		if _, err := db.ExecContext(context.Background(), insert, id, `{"amount": 5}`, `{"source": "billing"}`); err != nil {
			t.Fatal(err)
		}
	}
	runs, offsets := Count(t, sub, topic, 3, offset, func(msg *message.Message) {
		if msg.Metadata.Get("source") != "billing" {
			t.Errorf("metadata = %v, want the row's", msg.Metadata)
		}
	})
	if runs["pay-42"] != 1 || len(runs) != 2 {
		t.Errorf("handler runs by UUID = %v; want pay-42 once and the other row once", runs)
	}
	if len(offsets) != 3 {
		t.Errorf("Offset() keys = %v; want three distinct rows", offsets)
	}
	for k := range offsets {
		if rest, ok := strings.CutPrefix(k, topic+"/"); !ok || rest == "" {
			t.Errorf("Offset() key %q, want %q/<offset>", k, topic)
		}
	}
}
