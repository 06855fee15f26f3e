package redisstore_test

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// The wiring of the README: a store on a client the application owns,
// behind the dedup middleware of a router. (No Output: it needs a Redis.)
func Example() {
	logger := watermill.NewStdLogger(false, false)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}

	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // let the middleware's StoreTimeout bound every call
	})
	defer client.Close() // the store never closes it

	store, err := redisstore.New(client, redisstore.Config{
		Logger: logger, // CheckServer's findings; nil discards them
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	dedupMW, err := middleware.New(middleware.Config{Store: store, Scope: "orders"})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dedupMW.Middleware)
	// router.AddConsumerHandler(...); router.Run(ctx)
}

// Records in Redis Cluster: multi-key claims are taken key by key in a
// fixed order, so a ClusterClient works as it is.
func ExampleNew_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Config{
		Prefix:               "dd:", // shorter keys: see README, Memory per record
		DigestKeysLongerThan: 32,    // long business keys cost 16 bytes
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
	_ = store
}

// Batching is on by default; BatchConfig bounds it, or turns it off. (The
// snippet of the README's Batching section.)
func ExampleBatchConfig() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Config{
		Batch: redisstore.BatchConfig{
			MaxBatch:    128, // default; at most 10000
			MaxInFlight: 2,   // default; at most 1024: pipelines (connections, per node) at once
			// Disabled: true, // one round trip per call
		},
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
}

// Compact keys: 14-byte Redis keys under the prefix "d:", 97 bytes a
// record instead of 113, at a collision probability of about n²/2⁹⁷ for n
// live records (see the README).
func ExampleConfig_compactKeys() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Config{CompactKeys: true})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
}

// Acknowledged means replicated: each write succeeds once a replica of
// its node has it, or fails with ErrNotReplicated. (The snippet of the
// README's section on replication and failover.)
func ExampleConfig_waitReplicas() {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7000"}, ContextTimeoutEnabled: true})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Config{
		WaitReplicas: 1,           // a write succeeds once 1 replica has it
		WaitTimeout:  time.Second, // the default; below the client's ReadTimeout
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
}
