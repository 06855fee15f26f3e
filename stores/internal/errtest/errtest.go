// Package errtest holds the assertions on error classes that the stores'
// tests share. It imports only the stores contract, so every store's
// tests, internal or external, may import it.
package errtest

import (
	"errors"
	"testing"

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
