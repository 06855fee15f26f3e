package natsstore_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// TestRouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on a natsstore whose connection goes through a TCP proxy the
// test owns, cut in the middle of a stream of messages and duplicate
// deliveries and restored later: fail-closed nacks during the cut and
// never runs the handler for a message it could not claim; after the
// restore every message is applied exactly once and every delivery acked
// (see testkit.RouterOutage).
func TestRouterOutage(t *testing.T) {
	store, proxy, nc, _ := proxied(t, natsstore.Config{})
	testkit.RouterOutage(t, store, proxy.Cut, func() { restore(t, proxy, nc) })
}

// waitFor polls cond until it holds or timeout passes.
var waitFor = testkit.WaitFor
