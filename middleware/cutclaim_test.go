package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// cutReplyStore records every claim at once, and answers the first only
// when the test lets it, or when the caller's context ends, as a store
// over a network does: the claim is on the record whether or not the
// caller waits for the answer.
type cutReplyStore struct {
	stores.Store
	claimed chan struct{} // the first claim is on the record, its reply held
	reply   chan struct{} // closed: the reply arrives
}

// Capabilities: a store over a network, whose calls wait.
func (s *cutReplyStore) Capabilities() stores.Capabilities {
	caps := s.Store.Capabilities()
	caps.NonBlocking = false
	return caps
}

func (s *cutReplyStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c, err := s.Store.Claim(context.WithoutCancel(ctx), scope, keys, lease)
	if err != nil || c.Result != stores.Claimed {
		return c, err
	}
	select {
	case s.claimed <- struct{}{}:
	default:
		return c, nil
	}
	select {
	case <-s.reply:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestClaimCutByAClosingRouterHoldsNoKey: a message whose context ends
// while its Claim is with the store (router.Close in a deploy) is nacked
// at once, and its redelivery, to the next consumer, runs. It failed: the
// claim the store recorded held the key for the whole lease, and every
// redelivery until then was nacked as in progress (a Kafka partition
// stalled for a lease after each shutdown that caught a claim in flight;
// the acceptance suite's graceful-shutdown scenario showed it).
func TestClaimCutByAClosingRouterHoldsNoKey(t *testing.T) {
	store := &cutReplyStore{Store: newMemstore(t), claimed: make(chan struct{}, 1), reply: make(chan struct{})}
	mw, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Lease: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })

	ctx, cancel := context.WithCancel(context.Background())
	first := message.NewMessage("m1", nil)
	first.SetContext(ctx)
	go func() {
		<-store.claimed
		cancel() // the router closes while the store has the claim
	}()
	if _, err := h(first); !errors.Is(err, context.Canceled) {
		t.Fatalf("first delivery: err = %v, want the context's end", err)
	}
	if runs != 0 {
		t.Fatalf("the handler ran %d times for a delivery whose claim failed", runs)
	}
	close(store.reply) // the store's answer arrives after the nack

	// The redelivery, to the consumer that resumes the subscription: in
	// progress only until the cut claim is given back, not for the lease.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := h(message.NewMessage("m1", nil))
		if err == nil {
			break
		}
		if !errors.Is(err, dedup.ErrInProgress) || time.Now().After(deadline) {
			t.Fatalf("redelivery after the shutdown: %v (the claim the cancelled delivery left holds the key until its lease runs out)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}
