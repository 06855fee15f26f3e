package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestRefusedCompleteAcksWithTheRecordedOutputs: our lease ran out, a
// rival took the message over, ran it and recorded its outputs; our
// Complete is refused, and the record is done. The message is acked with
// the outputs that were recorded — the ones every later duplicate
// re-emits — never with this run's own.
func TestRefusedCompleteAcksWithTheRecordedOutputs(t *testing.T) {
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	cfg := middleware.Config{Store: store, Scope: "s", Lease: time.Minute, Heartbeat: -1}
	ours, rival := dedupMiddleware(t, cfg), dedupMiddleware(t, cfg)
	out, err := ours(func(msg *message.Message) ([]*message.Message, error) {
		clock.Advance(2 * time.Minute) // this run stalls past its lease...
		// ...and a redelivery to another consumer takes it over, runs it
		// and records its outputs.
		rivalOut, err := rival(func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("rival-out", []byte("rival"))}, nil
		})(message.NewMessage(msg.UUID, nil))
		if err != nil || len(rivalOut) != 1 {
			t.Errorf("rival run: %v, %v", rivalOut, err)
		}
		return []*message.Message{message.NewMessage("our-out", []byte("ours"))}, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("err = %v, want an ack: the message is done", err)
	}
	if len(out) != 1 || out[0].UUID != "rival-out" {
		t.Fatalf("outputs = %v, want the recorded rival-out", uuids(out))
	}
}

// vanishingStore loses the record on the first Complete (as a store that
// lost its data would) and reports the claim lost; every later Complete
// fails with an outage.
type vanishingStore struct {
	stores.Store
	completes atomic.Int32
}

func (s *vanishingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if s.completes.Add(1) == 1 {
		if err := s.Store.Release(ctx, c); err != nil {
			return err
		}
		return fmt.Errorf("%w: record gone", stores.ErrLostClaim)
	}
	return fmt.Errorf("%w: store down (simulated)", stores.ErrUnavailable)
}

// TestReconcileReleasesWhatItCouldNotRecord: a refused Complete whose
// record is gone claims the keys again to record this run; when that
// Complete fails too, the new claim is released, so the redelivery (the
// message is nacked) runs at once instead of finding it in progress for
// a whole lease.
func TestReconcileReleasesWhatItCouldNotRecord(t *testing.T) {
	mem := newMemstore(t)
	store := &vanishingStore{Store: mem}
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Lease: time.Hour, CompleteTimeout: time.Millisecond})
	_, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil))
	if !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("err = %v, want a nack wrapping ErrLostClaim", err)
	}
	c, err := mem.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim after the failed reconcile = %+v, %v; want Claimed (the reconcile's claim released)", c, err)
	}
}

func uuids(msgs []*message.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.UUID)
	}
	return out
}
