package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
)

// TestAsyncDuplicateWaitsUpToCompleteTimeout: a duplicate waits for this
// middleware's own Complete of its keys for Tuning.CompleteTimeout, not
// for as long as that Complete takes: here a store call that hangs until
// StoreTimeout, 200 times longer. The duplicate is in progress while the
// Complete is still on its way, which Close, given up on at once, reports.
func TestAsyncDuplicateWaitsUpToCompleteTimeout(t *testing.T) {
	store := newGatedStore(t) // never opened: the Complete hangs
	m := newAsync(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{
		StoreTimeout: 10 * time.Second,
		Tuning:       dedup.Tuning{CompleteTimeout: 50 * time.Millisecond},
	}})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	<-store.entered
	if _, err := h(message.NewMessage("m-1", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate while its Complete hangs: %v, want ErrInProgress", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Close(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close = %v, want Canceled: the duplicate came back only once the Complete had ended", err)
	}
}
