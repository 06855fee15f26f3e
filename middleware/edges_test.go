package middleware_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
)

// Records done before Fingerprint was turned on carry no fingerprint:
// their duplicates are acked, not refused as a mismatch.
func TestRecordWithoutFingerprintIsADuplicate(t *testing.T) {
	store := newMemstore(t)
	ran := 0
	h := func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil }
	before := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Key: keyfuncs.JSON("id")})
	if _, err := before(h)(message.NewMessage("1", []byte(`{"id":"A"}`))); err != nil {
		t.Fatal(err)
	}
	metrics := &testkit.Metrics{}
	after := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Key: keyfuncs.JSON("id"), Fingerprint: middleware.PayloadFingerprint, Policy: dedup.Policy{Metrics: metrics}})
	if _, err := after(h)(message.NewMessage("2", []byte(`{"id":"A"}`))); err != nil {
		t.Fatalf("duplicate of a record without a fingerprint: %v, want an ack", err)
	}
	if ran != 1 || metrics.Outcome(dedup.OutcomeDuplicate) != 1 {
		t.Fatalf("handler ran %d times, %d duplicates counted; want 1 and 1", ran, metrics.Outcome(dedup.OutcomeDuplicate))
	}
}

// A failed Complete is retried with a backoff, not in a busy loop: over a
// 300ms CompleteTimeout the store sees a handful of attempts.
func TestCompleteRetriesBackOff(t *testing.T) {
	store := &flakyStore{Store: newMemstore(t)}
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 300 * time.Millisecond, Heartbeat: -1}}})
	var before int64
	h := mw(func(*message.Message) ([]*message.Message, error) {
		store.down.Store(true)
		before = store.calls.Load()
		return nil, nil
	})
	// The effect happened: acked after CompleteTimeout even though the
	// record could not be written.
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	// Attempts at 0, 20, 60, 140 and 300ms at the most.
	if n := store.calls.Load() - before; n < 2 || n > 10 {
		t.Fatalf("%d Complete attempts in a 300ms CompleteTimeout, want a few (a doubling backoff from 20ms)", n)
	}
}
