package testkit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// ReturnsDuringOutage runs call, a store call during an outage the test
// ends only afterwards, and returns its error: the call must give up by
// itself (at once, or by its context's deadline) rather than wait for the
// outage to end. How long it takes on a loaded machine does not matter;
// a minute without an answer is a call that waits for ever, and fails t.
func ReturnsDuringOutage(t testing.TB, what string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	watchdog := time.NewTimer(time.Minute)
	defer watchdog.Stop()
	select {
	case err := <-done:
		return err
	case <-watchdog.C:
		t.Fatalf("%s has not returned after a minute: it waits for the outage to end", what)
		return nil
	}
}

// GiveUpUnanswered runs each of calls with a deadline of 300ms, while a
// proxy swallows everything (Proxy.Blackhole) for a backend that
// does not answer, and fails t unless each gives up by itself, however
// late a loaded machine lets it (ReturnsDuringOutage), with an outage:
// an error wrapping stores.ErrUnavailable or context.DeadlineExceeded.
// backend names the store's server in the messages ("a Redis").
func GiveUpUnanswered(t testing.TB, backend string, calls map[string]func(context.Context) error) {
	t.Helper()
	for name, call := range calls {
		what := name + " on " + backend + " that does not answer"
		err := ReturnsDuringOutage(t, what, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			return call(ctx)
		})
		if !errors.Is(err, stores.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err = %v, want an outage (ErrUnavailable or DeadlineExceeded)", what, err)
		}
	}
}

// MustClaim claims keys in scope on s for lease and fails t now unless
// they are claimed.
func MustClaim(t testing.TB, s stores.Store, scope string, lease time.Duration, keys ...string) *stores.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), scope, keys, lease)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(%q) = %+v, %v", keys, c, err)
	}
	return c
}
