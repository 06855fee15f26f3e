package natsstore

import (
	"context"
	"errors"
	"testing"
)

// A claim's lock is held by one call at a time; a wait ends with its
// context; the map forgets a token once no call holds or waits for it.
func TestClaimLocks(t *testing.T) {
	var l claimLocks
	ctx := context.Background()
	unlock, err := l.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.lock(ctx, "b") // another claim: not held up
	if err != nil {
		t.Fatal(err)
	}
	other()
	waiting, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		u, err := l.lock(waiting, "a")
		if err == nil {
			u()
		}
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait whose context ended = %v", err)
	}
	next := make(chan func(), 1)
	go func() {
		u, err := l.lock(ctx, "a")
		if err != nil {
			t.Error(err)
		}
		next <- u
	}()
	unlock()
	(<-next)()
	if len(l.m) != 0 {
		t.Fatalf("the map keeps %d tokens no call holds", len(l.m))
	}
}
