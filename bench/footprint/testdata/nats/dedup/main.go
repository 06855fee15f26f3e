// A user of publisher + stores/natsstore: a producer whose publisher is
// decorated with the dedup publisher, on a store in JetStream KV.
package main

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

func main() {
	ctx := context.Background()
	logger := watermill.NewStdLogger(false, false)
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()

	store, err := natsstore.New(ctx, nc, natsstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(ctx)
	dp, err := publisher.New(publisher.Config{Store: store, Key: keyfuncs.JSON("order_id")})
	if err != nil {
		panic(err)
	}
	pub, err := dp.Decorate(gochannel.NewGoChannel(gochannel.Config{}, logger))
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORD-7"}`))
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}
}
