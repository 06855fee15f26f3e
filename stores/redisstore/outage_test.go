package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestRouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on a redisstore whose connection goes through a TCP proxy the
// test owns, cut in the middle of a stream of messages and duplicate
// deliveries and restored later: fail-closed nacks during the cut and
// never runs the handler for a message it could not claim; after the
// restore every message is applied exactly once and every delivery acked
// (see testkit.RouterOutage).
func TestRouterOutage(t *testing.T) {
	addr := testkit.RequireRedis(t)
	proxy := testkit.NewProxy(t, addr)
	direct := newClient(t, addr)
	viaProxy := redis.NewClient(&redis.Options{
		Addr:                  proxy.Addr(),
		ContextTimeoutEnabled: true,
		DialTimeout:           500 * time.Millisecond,
	})
	t.Cleanup(func() { _ = viaProxy.Close() })
	store := newStore(t, viaProxy, redisstore.Config{Prefix: testPrefix(t, direct)})
	testkit.RouterOutage(t, store, proxy.Cut, proxy.Restore)
}

// waitFor polls cond until it holds or timeout passes.
var waitFor = testkit.WaitFor
