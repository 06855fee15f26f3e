// A user of middleware + stores/redisstore: a router whose handler runs
// behind the dedup middleware, on a store on the application's client.
package main

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Config{Logger: logger})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
	dedupMW, err := middleware.New(middleware.Config{Store: store, Scope: "orders"})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dedupMW.Middleware)

	router.AddConsumerHandler("orders", "orders", pubSub, func(msg *message.Message) error {
		return client.Incr(msg.Context(), "orders").Err()
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}
