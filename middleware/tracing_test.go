package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestTracing: a span per store call, a child of the message's span, with
// the outcome, scope, key count, store kind, mode and side; a duplicate's
// span says how long ago its record was completed; keys only when asked.
func TestTracing(t *testing.T) {
	tr := spantest.NewTraces(t)
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Minute, Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tr.TP}}})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	base := map[string]any{"dedup.scope": "s", "dedup.keys.count": 1, "dedup.store": "memstore", "dedup.mode": "lease", "dedup.side": "consumer", "dedup.keys": nil}

	msg, parent := tr.Message("m-1")
	if _, err := mw(ok)(msg); err != nil {
		t.Fatal(err)
	}
	spans := tr.DedupSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans for a claimed message, want claim and complete", len(spans))
	}
	spantest.WantSpan(t, spans[0], "dedup.claim", parent, false, spantest.Merge(base, map[string]any{"dedup.outcome": "claimed"}))
	spantest.WantSpan(t, spans[1], "dedup.complete", parent, false, base)

	msg, parent = tr.Message("m-1")
	if _, err := mw(ok)(msg); err != nil {
		t.Fatal(err)
	}
	spans = tr.DedupSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans for a duplicate, want the claim", len(spans))
	}
	spantest.WantSpan(t, spans[0], "dedup.claim", parent, false, spantest.Merge(base, map[string]any{"dedup.outcome": "duplicate"}))
	if age, ok := spantest.Attr(spans[0], "dedup.record.age"); !ok || age.AsFloat64() < 0 || age.AsFloat64() > 60 {
		t.Errorf("duplicate: dedup.record.age = %v, %v; want the seconds since the Complete", age.AsInterface(), ok)
	}

	// In progress: another claim holds the key.
	held, err := store.Claim(context.Background(), "s", []string{"m-2"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	msg, parent = tr.Message("m-2")
	if _, err := mw(ok)(msg); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatal(err)
	}
	spantest.WantSpan(t, tr.DedupSpans()[0], "dedup.claim", parent, false, spantest.Merge(base, map[string]any{"dedup.outcome": "in_progress"}))

	// Takeover, then a handler error: the release.
	clock.Advance(3 * time.Minute)
	_ = held
	msg, parent = tr.Message("m-2")
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })(msg); err == nil {
		t.Fatal("the handler's error was not returned")
	}
	spans = tr.DedupSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want claim and release", len(spans))
	}
	spantest.WantSpan(t, spans[0], "dedup.claim", parent, false, spantest.Merge(base, map[string]any{"dedup.outcome": "takeover"}))
	spantest.WantSpan(t, spans[1], "dedup.release", parent, false, base)
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
			tr := spantest.NewTraces(t)
			store := failingStore{Store: newMemstore(t), fail: failWith(tc.err)}
			mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{OnStoreError: tc.policy, Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tr.TP}}})
			msg, parent := tr.Message("m-1")
			if tc.cancelled {
				ctx, cancel := context.WithCancel(msg.Context())
				cancel()
				msg.SetContext(ctx)
			}
			_, _ = mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
			spans := tr.DedupSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want the claim's", len(spans))
			}
			spantest.WantSpan(t, spans[0], "dedup.claim", parent, true, map[string]any{"dedup.outcome": tc.outcome})
			if evs := spans[0].Events(); len(evs) == 0 || evs[0].Name != "exception" {
				t.Errorf("the error was not recorded: %v", evs)
			}
		})
	}
}
