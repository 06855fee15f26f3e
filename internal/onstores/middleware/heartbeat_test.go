package middleware_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
)

// TestHeartbeatBesideCompleteOnNATS: on natsstore, whose Extend and
// Complete are compare-and-swaps on the revision they read, a heartbeat
// beating as often as it can beside every Complete never turns the
// Complete into a lost claim: with no other consumer and no outage,
// every message is acked once and every publish is recorded. Before, one
// message in a few hundred was nacked as taken over (and run again after
// the lease), and the publisher published again.
func TestHeartbeatBesideCompleteOnNATS(t *testing.T) {
	store := openStore(t, anystore.StoreParams{Kind: anystore.StoreNATS})
	policy := dedup.Policy{Lease: time.Hour, Logger: watermill.NopLogger{}, Tuning: dedup.Tuning{Heartbeat: time.Nanosecond}}
	t.Run("middleware", func(t *testing.T) {
		m := &testkit.Metrics{}
		p := policy
		p.Metrics = m
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "beside", Policy: p})
		h := mw(func(*message.Message) ([]*message.Message, error) {
			time.Sleep(2 * time.Millisecond) // a few heartbeats
			return nil, nil
		})
		for i := range 300 {
			if _, err := h(message.NewMessage(fmt.Sprintf("m-%d", i), nil)); err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
		if n := m.Outcome(dedup.OutcomeLostClaim); n != 0 {
			t.Fatalf("%d lost claims counted", n)
		}
	})
	t.Run("publisher", func(t *testing.T) {
		m := &testkit.Metrics{}
		p := policy
		p.Metrics = m
		d, err := publisher.New(publisher.Config{Store: store, Scope: "beside-pub", Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		var published atomic.Int32
		pub, err := d.Decorate(testkit.PublisherFunc(func(string, ...*message.Message) error {
			time.Sleep(2 * time.Millisecond)
			published.Add(1)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 300 {
			id := fmt.Sprintf("p-%d", i)
			if err := pub.Publish("t", message.NewMessage(id, nil)); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			// A producer retry right after: a duplicate, not in progress.
			if err := pub.Publish("t", message.NewMessage(id, nil)); errors.Is(err, dedup.ErrInProgress) || err != nil {
				t.Fatalf("retry of publish %d: %v (its record was not written)", i, err)
			}
		}
		if n := published.Load(); n != 300 || m.Outcome(dedup.OutcomeLostClaim) != 0 {
			t.Fatalf("published %d of 300, lost claims %d", n, m.Outcome(dedup.OutcomeLostClaim))
		}
	})
}
