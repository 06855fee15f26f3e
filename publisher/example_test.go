package publisher_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
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

// The transactional outbox: the dedup record is written in the service's
// transaction, beside the business rows and the outbox row of
// watermill-sql's publisher, so the event enters the outbox exactly once
// whatever the service retries.
func ExampleModeTransactional() {
	var db *sql.DB // the service's database (PostgreSQL, MySQL or SQLite)
	store, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.Postgres})
	if err != nil {
		panic(err)
	}
	dp, err := publisher.New(publisher.Config{
		Store: store,
		Mode:  dedup.ModeTransactional,
		Key:   keyfuncs.Metadata("order_id"),
	})
	if err != nil {
		panic(err)
	}

	placeOrder := func(ctx context.Context, orderID string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		// ... the business rows, in tx ...
		outbox, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
		if err != nil {
			return err
		}
		pub, err := dp.Decorate(outbox)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+orderID+`"}`))
		msg.Metadata.Set("order_id", orderID)
		msg.SetContext(sqlstore.WithTx(ctx, tx)) // the record joins tx
		if err := pub.Publish("orders", msg); err != nil {
			return err
		}
		return tx.Commit() // business rows, outbox row and record, together
	}
	_ = placeOrder
}
