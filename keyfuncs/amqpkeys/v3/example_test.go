package amqpkeys_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	amqpkeys "github.com/watermill-dedup/dedup/keyfuncs/amqpkeys/v3"
)

// A message another producer published with the message_id property:
// with Marshaler as the watermill-amqp v3 subscriber's marshaler it has
// that id as its UUID, so the middleware's default key works, and its
// properties in metadata.
func ExampleMarshaler() {
	cfg := amqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}

	// What the subscriber does with a delivery:
	msg, err := cfg.Marshaler.Unmarshal(amqp091.Delivery{
		MessageId: "order-42",
		Headers:   amqp091.Table{"attempt": int32(1)},
		Body:      []byte(`{"order_id": 42, "operation": "ship"}`),
	})
	if err != nil {
		panic(err)
	}
	key := keyfuncs.All(
		keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
		keyfuncs.Prefix("order:", keyfuncs.JSON("order_id", "operation")),
	)
	keys, err := key(msg)
	fmt.Println(msg.UUID, msg.Metadata.Get(amqpkeys.MetadataMessageID), msg.Metadata.Get("attempt"))
	fmt.Println(keys, err)
	// Output:
	// order-42 order-42 1
	// [msg:order-42 order:42:ship] <nil>
}
