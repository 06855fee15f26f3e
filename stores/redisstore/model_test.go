package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// modelOptions describe a store with cfg to storetest.RunModel: Redis
// keeps time on the server, to the millisecond, and the store bounds
// scopes, and keys unless CompactKeys, to MaxKeyLen.
func modelOptions(cfg redisstore.Config) []storetest.Option {
	opts := []storetest.Option{
		storetest.RealTime(unit),
		storetest.Precision(time.Millisecond),
		storetest.MaxScopeLen(redisstore.DefaultMaxKeyLen),
	}
	if !cfg.CompactKeys {
		opts = append(opts, storetest.MaxKeyLen(redisstore.DefaultMaxKeyLen))
	}
	return opts
}

// runModels runs the model on client for each config, in parallel: the
// model mostly sleeps, to let real time pass.
func runModels(t *testing.T, client redis.UniversalClient, cfgs map[string]redisstore.Config) {
	for name, cfg := range cfgs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.RunModel(t, factory(client, cfg), modelOptions(cfg)...)
		})
	}
}

// TestModel checks the store against the model of the Store contract on
// the shared Redis, batched and unbatched, and with CompactKeys.
func TestModel(t *testing.T) {
	c := sharedRedis(t)
	runModels(t, c, map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
		"Compact":   {CompactKeys: true},
	})
}

// TestModelCluster checks the store against the model in a Redis Cluster
// of three masters it starts (see startCluster), where the keys of a
// claim live on different nodes.
func TestModelCluster(t *testing.T) {
	cc := startCluster(t)
	runModels(t, cc, map[string]redisstore.Config{
		"Batched":   {},
		"Unbatched": {Batch: redisstore.BatchConfig{Disabled: true}},
	})
}
