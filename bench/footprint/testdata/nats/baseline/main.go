// The baseline of the nats case: the same publisher and a JetStream KV
// bucket on the connection, without the dedup packages.
package main

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx := context.Background()
	logger := watermill.NewStdLogger(false, false)
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()

	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "orders"})
	if err != nil {
		panic(err)
	}
	pub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer pub.Close()

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORD-7"}`))
	if _, err := kv.Create(ctx, "ORD-7", msg.Payload); err != nil {
		panic(err)
	}
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}
}
