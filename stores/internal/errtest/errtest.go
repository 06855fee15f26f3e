// Package errtest holds the assertions on error classes that the stores'
// tests share. It imports only the stores contract, so every store's
// tests, internal or external, may import it.
package errtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// Wraps fails t, and goes on, unless err wraps target.
func Wraps(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: err = %v, want one wrapping %v", what, err, target)
	}
}

// NotOutage is Wraps, and also fails t when err is classified as an
// outage (wraps stores.ErrUnavailable): the class a fail-open consumer
// runs its handler through unprotected.
func NotOutage(t testing.TB, what string, err, target error) {
	t.Helper()
	Wraps(t, what, err, target)
	if errors.Is(err, stores.ErrUnavailable) {
		t.Errorf("%s: err = %v is classified as an outage", what, err)
	}
}

// ContextNotOutage checks that a Claim under a cancelled context and a
// Claim and a Complete (of held) under an expired one fail with the
// context's error, not as an outage: the caller gave up, the store did
// not fail.
func ContextNotOutage(t testing.TB, s stores.Store, held *stores.Claim) {
	t.Helper()
	bg := context.Background()
	done, cancelDone := context.WithCancel(bg)
	cancelDone()
	_, err := s.Claim(done, "s", []string{"k"}, time.Minute)
	NotOutage(t, "Claim with a cancelled context", err, context.Canceled)
	expired, cancelExpired := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancelExpired()
	_, err = s.Claim(expired, "s", []string{"k"}, time.Minute)
	NotOutage(t, "Claim with an expired context", err, context.DeadlineExceeded)
	NotOutage(t, "Complete with an expired context", s.Complete(expired, held, time.Hour, nil), context.DeadlineExceeded)
}
