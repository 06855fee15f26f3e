package testkit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

// RefusedCalls makes n Claims of fresh keys on s, a store whose server
// refuses the client (its credentials, its TLS, its privileges), and
// fails t now unless each fails with an error that is no outage (neither
// stores.ErrUnavailable nor an outage to the claim cycle, which FailOpen
// runs handlers through) and whose text holds want: as written, or in
// any case when anyCase.
func RefusedCalls(t testing.TB, s stores.Store, n int, want string, anyCase bool) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := s.Claim(ctx, "s", []string{"refused-" + string(rune('a'+i%26))}, time.Minute)
		cancel()
		switch {
		case err == nil:
			t.Fatalf("Claim %d: the client was let in, want %q", i, want)
		case errors.Is(err, stores.ErrUnavailable) || cycle.IsOutage(err):
			t.Fatalf("Claim %d: %v: an outage, want a refusal (%q)", i, err, want)
		case anyCase && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)),
			!anyCase && !strings.Contains(err.Error(), want):
			t.Fatalf("Claim %d: %v, want %q", i, err, want)
		}
	}
}
