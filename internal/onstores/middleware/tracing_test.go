package middleware_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
)

// TestTracingOptions: keys are recorded only when asked; no tracer, no
// span; the producer side and the transactional mode are traced too.
func TestTracingOptions(t *testing.T) {
	t.Run("keys", func(t *testing.T) {
		tr := spantest.NewTraces(t)
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: testkit.Memstore(t, nil), Scope: "s", Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP, RecordKeys: true}}})
		msg, _ := tr.Message("m-1")
		if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
			t.Fatal(err)
		}
		for _, s := range tr.DedupSpans() {
			if v, ok := spantest.Attr(s, "dedup.keys"); !ok || fmt.Sprint(v.AsStringSlice()) != "[m-1]" {
				t.Errorf("%s: dedup.keys = %v, %v", s.Name(), v.AsInterface(), ok)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		tr := spantest.NewTraces(t)
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: testkit.Memstore(t, nil), Scope: "s"})
		msg, _ := tr.Message("m-1")
		if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
			t.Fatal(err)
		}
		if spans := tr.DedupSpans(); len(spans) != 0 {
			t.Fatalf("%d spans with tracing off", len(spans))
		}
	})
	t.Run("publisher", func(t *testing.T) {
		tr := spantest.NewTraces(t)
		d, err := publisher.New(publisher.Config{Store: testkit.Memstore(t, nil), Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP}}})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := d.Decorate(testkit.PublisherFunc(func(string, ...*message.Message) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		msg, parent := tr.Message("p-1")
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
		spans := tr.DedupSpans()
		if len(spans) != 2 {
			t.Fatalf("%d spans, want claim and complete", len(spans))
		}
		side := map[string]any{"dedup.scope": "publish:orders", "dedup.side": "producer", "dedup.mode": "lease"}
		spantest.WantSpan(t, spans[0], "dedup.claim", parent, false, spantest.Merge(side, map[string]any{"dedup.outcome": "claimed"}))
		spantest.WantSpan(t, spans[1], "dedup.complete", parent, false, side)
	})
	t.Run("transactional", func(t *testing.T) {
		tr := spantest.NewTraces(t)
		store := openStore(t, anystore.StoreParams{Kind: anystore.StoreSQLite})
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Mode: dedup.ModeTransactional, Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP}}})
		for _, fail := range []bool{false, true} {
			msg, parent := tr.Message(fmt.Sprintf("t-%v", fail))
			_, _ = mw(func(*message.Message) ([]*message.Message, error) {
				if fail {
					return nil, errors.New("boom")
				}
				return nil, nil
			})(msg)
			spans := tr.DedupSpans()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want begin and commit or rollback", len(spans))
			}
			spantest.WantSpan(t, spans[0], "dedup.begin", parent, false, map[string]any{"dedup.outcome": "claimed", "dedup.mode": "transactional"})
			end := map[bool]string{false: "dedup.commit", true: "dedup.rollback"}[fail]
			spantest.WantSpan(t, spans[1], end, parent, false, map[string]any{"dedup.mode": "transactional"})
		}
	})
}
