package testkit

import (
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit/base"
)

// Closing listens on a loopback port of its own and closes every
// connection it accepts at once: with a reset (SO_LINGER 0) when reset,
// else with an EOF (base.Closing). It returns the address; the listener
// stops when t ends.
func Closing(t testing.TB, reset bool) string {
	t.Helper()
	return base.Closing(t, reset)
}
