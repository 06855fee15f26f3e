package publisher_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// A producer that retries — here, one that builds a new message for each
// attempt — publishes the order once: the key is the order id, not the
// message's UUID.
func ExampleNew() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	dp, err := publisher.New(publisher.Config{
		Store:  store,
		Key:    keyfuncs.JSON("order_id"),
		Policy: dedup.Policy{Retention: 10 * time.Minute},
	})
	if err != nil {
		panic(err)
	}

	pub, err := dp.Decorate(printingPublisher{}) // or router.AddPublisherDecorators(dp.Decorate)
	if err != nil {
		panic(err)
	}

	for attempt := 1; attempt <= 3; attempt++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORD-7","total":42}`))
		if err := pub.Publish("orders", msg); err != nil {
			panic(err)
		}
		fmt.Println("attempt", attempt, "ok")
	}
	// Output:
	// published to orders: {"order_id":"ORD-7","total":42}
	// attempt 1 ok
	// attempt 2 ok
	// attempt 3 ok
}

// printingPublisher stands for a broker's publisher (Kafka, RabbitMQ,
// ...): it prints what it is asked to publish.
type printingPublisher struct{}

func (printingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("published to %s: %s\n", topic, m.Payload)
	}
	return nil
}

func (printingPublisher) Close() error { return nil }
