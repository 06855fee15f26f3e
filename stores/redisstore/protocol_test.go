package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestRESP2 runs the conformance suite and the model of the Store
// contract over RESP2 (Redis before 6, many proxies, clients pinned to
// it), whose replies to the scripts and to SET ... GET decode differently
// from RESP3's. RESP3, go-redis v9's default, is what every other test of
// this package speaks.
func TestRESP2(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testkit.RequireRedis(t), Protocol: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for name, cfg := range map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
	} {
		t.Run(name, func(t *testing.T) {
			// Not in parallel: the model already runs four sequences at
			// once.
			storetest.Run(t, factory(c, cfg), serverTime(c))
			storetest.RunModel(t, factory(c, cfg), modelOptions(cfg)...)
		})
	}
}
