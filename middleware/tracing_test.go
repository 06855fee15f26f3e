package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// traced is a tracer provider recording every span in memory.
type traced struct{ *spantest.Traces }

func newTraced(t *testing.T) *traced { return &traced{spantest.NewTraces(t)} }

// parent returns a message whose context carries a span of its own (the
// handler's, as a tracing middleware or subscriber puts it there).
func (tr *traced) message(uuid string) (*message.Message, trace.SpanContext) {
	ctx, sc := tr.Span("handler")
	msg := message.NewMessage(uuid, nil)
	msg.SetContext(ctx)
	return msg, sc
}

// spans returns the ended dedup spans, then forgets them.
func (tr *traced) spans() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.Rec.Ended() {
		if s.InstrumentationScope().Name == "github.com/watermill-dedup/dedup" {
			out = append(out, s)
		}
	}
	tr.Rec.Reset()
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantSpan checks a span's name, parent, status and attributes.
func wantSpan(t *testing.T, s sdktrace.ReadOnlySpan, name string, parent trace.SpanContext, failed bool, attrs map[string]any) {
	t.Helper()
	if s.Name() != name {
		t.Errorf("span %q, want %q", s.Name(), name)
	}
	if parent.IsValid() && s.Parent().SpanID() != parent.SpanID() {
		t.Errorf("%s: parent %s, want the message's span %s", name, s.Parent().SpanID(), parent.SpanID())
	}
	if s.SpanKind() != trace.SpanKindClient {
		t.Errorf("%s: kind %s, want client", name, s.SpanKind())
	}
	if got := s.Status().Code == codes.Error; got != failed {
		t.Errorf("%s: status %v, want error=%v", name, s.Status(), failed)
	}
	for k, v := range attrs {
		got, ok := attr(s, k)
		switch {
		case !ok && v != nil:
			t.Errorf("%s: no attribute %s", name, k)
		case ok && v == nil:
			t.Errorf("%s: attribute %s = %v, want none", name, k, got.Emit())
		case ok && fmt.Sprint(got.AsInterface()) != fmt.Sprint(v):
			t.Errorf("%s: %s = %v, want %v", name, k, got.AsInterface(), v)
		}
	}
}

// TestTracing: a span per store call, a child of the message's span, with
// the outcome, scope, key count, store kind, mode and side; a duplicate's
// span says how long ago its record was completed; keys only when asked.
func TestTracing(t *testing.T) {
	tr := newTraced(t)
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Minute, Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tr.TP}}})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	base := map[string]any{"dedup.scope": "s", "dedup.keys.count": 1, "dedup.store": "memstore", "dedup.mode": "lease", "dedup.side": "consumer", "dedup.keys": nil}

	msg, parent := tr.message("m-1")
	if _, err := mw(ok)(msg); err != nil {
		t.Fatal(err)
	}
	spans := tr.spans()
	if len(spans) != 2 {
		t.Fatalf("%d spans for a claimed message, want claim and complete", len(spans))
	}
	wantSpan(t, spans[0], "dedup.claim", parent, false, merge(base, map[string]any{"dedup.outcome": "claimed"}))
	wantSpan(t, spans[1], "dedup.complete", parent, false, base)

	msg, parent = tr.message("m-1")
	if _, err := mw(ok)(msg); err != nil {
		t.Fatal(err)
	}
	spans = tr.spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans for a duplicate, want the claim", len(spans))
	}
	wantSpan(t, spans[0], "dedup.claim", parent, false, merge(base, map[string]any{"dedup.outcome": "duplicate"}))
	if age, ok := attr(spans[0], "dedup.record.age"); !ok || age.AsFloat64() < 0 || age.AsFloat64() > 60 {
		t.Errorf("duplicate: dedup.record.age = %v, %v; want the seconds since the Complete", age.AsInterface(), ok)
	}

	// In progress: another claim holds the key.
	held, err := store.Claim(context.Background(), "s", []string{"m-2"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	msg, parent = tr.message("m-2")
	if _, err := mw(ok)(msg); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatal(err)
	}
	wantSpan(t, tr.spans()[0], "dedup.claim", parent, false, merge(base, map[string]any{"dedup.outcome": "in_progress"}))

	// Takeover, then a handler error: the release.
	clock.Advance(3 * time.Minute)
	_ = held
	msg, parent = tr.message("m-2")
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })(msg); err == nil {
		t.Fatal("the handler's error was not returned")
	}
	spans = tr.spans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want claim and release", len(spans))
	}
	wantSpan(t, spans[0], "dedup.claim", parent, false, merge(base, map[string]any{"dedup.outcome": "takeover"}))
	wantSpan(t, spans[1], "dedup.release", parent, false, base)
}

func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestTracingFailures: a claim that fails has status Error, the error
// recorded, and says what the failure meant for the message.
func TestTracingFailures(t *testing.T) {
	outage := fmt.Errorf("%w: connection refused", stores.ErrUnavailable)
	for _, tc := range []struct {
		name      string
		err       error
		policy    dedup.StoreErrorPolicy
		cancelled bool
		outcome   string
	}{
		{"store error", errors.New("permission denied"), dedup.FailOpen, false, "store_error"},
		{"bypassed", outage, dedup.FailOpen, false, "bypassed"},
		{"fail-closed outage", outage, dedup.FailClosed, false, "store_error"},
		{"cancelled", outage, dedup.FailOpen, true, "cancelled"},
		{"bad key", fmt.Errorf("%w: too long", stores.ErrInvalidKey), dedup.FailOpen, false, "no_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTraced(t)
			store := failingStore{Store: newMemstore(t), fail: failWith(tc.err)}
			mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{OnStoreError: tc.policy, Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tr.TP}}})
			msg, parent := tr.message("m-1")
			if tc.cancelled {
				ctx, cancel := context.WithCancel(msg.Context())
				cancel()
				msg.SetContext(ctx)
			}
			_, _ = mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
			spans := tr.spans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want the claim's", len(spans))
			}
			wantSpan(t, spans[0], "dedup.claim", parent, true, map[string]any{"dedup.outcome": tc.outcome})
			if evs := spans[0].Events(); len(evs) == 0 || evs[0].Name != "exception" {
				t.Errorf("the error was not recorded: %v", evs)
			}
		})
	}
}

// TestTracingOptions: keys are recorded only when asked; no tracer, no
// span; the producer side and the transactional mode are traced too.
func TestTracingOptions(t *testing.T) {
	t.Run("keys", func(t *testing.T) {
		tr := newTraced(t)
		mw := dedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP, RecordKeys: true}}})
		msg, _ := tr.message("m-1")
		if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
			t.Fatal(err)
		}
		for _, s := range tr.spans() {
			if v, ok := attr(s, "dedup.keys"); !ok || fmt.Sprint(v.AsStringSlice()) != "[m-1]" {
				t.Errorf("%s: dedup.keys = %v, %v", s.Name(), v.AsInterface(), ok)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		tr := newTraced(t)
		mw := dedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s"})
		msg, _ := tr.message("m-1")
		if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
			t.Fatal(err)
		}
		if spans := tr.spans(); len(spans) != 0 {
			t.Fatalf("%d spans with tracing off", len(spans))
		}
	})
	t.Run("publisher", func(t *testing.T) {
		tr := newTraced(t)
		d, err := publisher.New(publisher.Config{Store: newMemstore(t), Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP}}})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := d.Decorate(publisherFunc(func(string, ...*message.Message) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		msg, parent := tr.message("p-1")
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
		spans := tr.spans()
		if len(spans) != 2 {
			t.Fatalf("%d spans, want claim and complete", len(spans))
		}
		side := map[string]any{"dedup.scope": "publish:orders", "dedup.side": "producer", "dedup.mode": "lease"}
		wantSpan(t, spans[0], "dedup.claim", parent, false, merge(side, map[string]any{"dedup.outcome": "claimed"}))
		wantSpan(t, spans[1], "dedup.complete", parent, false, side)
	})
	t.Run("transactional", func(t *testing.T) {
		tr := newTraced(t)
		store := openStore(t, anystore.StoreParams{Kind: anystore.StoreSQLite})
		mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Mode: dedup.ModeTransactional, Policy: dedup.Policy{Tracing: dedup.Tracing{Provider: tr.TP}}})
		for _, fail := range []bool{false, true} {
			msg, parent := tr.message(fmt.Sprintf("t-%v", fail))
			_, _ = mw(func(*message.Message) ([]*message.Message, error) {
				if fail {
					return nil, errors.New("boom")
				}
				return nil, nil
			})(msg)
			spans := tr.spans()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want begin and commit or rollback", len(spans))
			}
			wantSpan(t, spans[0], "dedup.begin", parent, false, map[string]any{"dedup.outcome": "claimed", "dedup.mode": "transactional"})
			end := map[bool]string{false: "dedup.commit", true: "dedup.rollback"}[fail]
			wantSpan(t, spans[1], end, parent, false, map[string]any{"dedup.mode": "transactional"})
		}
	})
}
