package natsstore_test

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// The wiring of the README: a store on a connection the application
// owns, behind the dedup middleware of a router. (No Output: it needs a
// NATS server with JetStream.)
func Example() {
	logger := watermill.NewStdLogger(false, false)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}

	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close() // the store never closes it

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Creates the bucket "dedup" when it does not exist: on nats-server
	// 2.11+ with per-key TTLs (each record expires on its own), before
	// that with a MaxAge of max(MaxRetention, 2 × MaxLease) + ClockSkew =
	// 24h1m. store.TTLMode() tells which.
	store, err := natsstore.New(ctx, nc, natsstore.Config{
		MaxRetention: 24 * time.Hour, // with a MaxAge: at least the middleware's Retention
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	dedupMW, err := middleware.New(middleware.Config{Store: store, Scope: "orders", Policy: dedup.Policy{Retention: 24 * time.Hour}})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dedupMW.Middleware)
	// router.AddConsumerHandler(...); router.Run(ctx)
}

// A clustered JetStream: the buckets it creates are replicated on three
// servers, and the records are spread over three buckets, whose stream
// leaders JetStream places on different servers.
func ExampleConfig_cluster() {
	ctx := context.Background()
	store, err := natsstore.Connect(ctx, "nats://n1:4222,nats://n2:4222,nats://n3:4222", natsstore.Config{
		Bucket:   "dedup",
		Shards:   3, // buckets dedup-0, dedup-1, dedup-2
		Replicas: 3,
	}, nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer store.Close(ctx) // closes the connection Connect opened
}

// Records expire by the bucket's MaxAge on every server, as before
// nats-server 2.11: for consumers that must share a bucket with older
// ones, which refuse a bucket without MaxAge.
func ExampleTTLMode() {
	ctx := context.Background()
	store, err := natsstore.Connect(ctx, "nats://127.0.0.1:4222", natsstore.Config{
		TTLMode:      natsstore.TTLBucket,
		MaxRetention: 48 * time.Hour, // the bucket's MaxAge: 48h1m
	})
	if err != nil {
		panic(err)
	}
	defer store.Close(ctx)
	_ = store.TTLMode() // natsstore.TTLBucket
}
