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

// holdElsewhere claims keys directly on store, as another consumer whose
// run holds them would.
func holdElsewhere(t *testing.T, store stores.Store, keys ...string) {
	t.Helper()
	c, err := store.Claim(context.Background(), "s", keys, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("the other consumer's claim: %+v, %v", c, err)
	}
}

// TestAsyncDuplicateOfAnotherConsumerClaimsOnce: under ModeAsyncComplete
// a duplicate whose keys another consumer holds, while none of this
// middleware's own Completes is on its way or has landed, costs one claim,
// as in ModeLease: there is nothing of its own to wait for or to claim
// again after.
func TestAsyncDuplicateOfAnotherConsumerClaimsOnce(t *testing.T) {
	gated := newGatedStore(t)
	store := &claimCounter{Store: gated}
	holdElsewhere(t, gated, "m-1")
	m := newAsync(t, middleware.Config{Store: store, Scope: "s"})
	if _, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate of another consumer's run: %v, want ErrInProgress", err)
	}
	if n := store.count(); n != 1 {
		t.Fatalf("%d claims for one duplicate of another consumer's run, want 1", n)
	}
}

// TestAsyncDuplicateClaimsOnceMoreAfterALanding: a Complete of this
// middleware's own lands between the store reading a duplicate's keys as
// in progress and the duplicate looking for its own Complete of them: it
// may have been theirs, so the duplicate claims once more. When another
// consumer holds them, that claim finds them in progress still, and the
// duplicate is in progress after those two claims, not claiming again.
func TestAsyncDuplicateClaimsOnceMoreAfterALanding(t *testing.T) {
	held := &heldClaimStore{gatedStore: newGatedStore(t), answered: make(chan *stores.Claim, 1), release: make(chan struct{})}
	store := &claimCounter{Store: held}
	holdElsewhere(t, held.gatedStore, "m-1")
	// A claim loop, were there one, would end at CompleteTimeout: the
	// duplicate's wait for its own Complete.
	m := newAsync(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 5 * time.Second}}})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-2", nil)); err != nil {
		t.Fatal(err)
	}
	<-held.entered // m-2's Complete is on its way

	held.hold.Store(true)
	res := make(chan error, 1)
	go func() { _, err := h(message.NewMessage("m-1", nil)); res <- err }()
	if c := <-held.answered; c.Result != stores.InProgress {
		t.Fatalf("the duplicate's claim = %s, want in progress", c.Result)
	}
	close(held.open)
	if err := m.Close(context.Background()); err != nil { // m-2's Complete has landed
		t.Fatal(err)
	}
	before := store.count()
	close(held.release)
	if err := <-res; !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate of another consumer's run: %v, want ErrInProgress", err)
	}
	if n := store.count() - before; n != 1 {
		t.Fatalf("%d claims after the landing, want 1", n)
	}
}
