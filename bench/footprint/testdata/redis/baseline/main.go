// The baseline of the redis case: the same router and client without
// the dedup packages.
package main

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"
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

	router.AddConsumerHandler("orders", "orders", pubSub, func(msg *message.Message) error {
		return client.Incr(msg.Context(), "orders").Err()
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}
