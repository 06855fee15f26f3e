package wsql3_test

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// The transactional outbox, with the publisher in
// dedup.ModeTransactional: the dedup record is written in the service's
// transaction, beside the business rows and the outbox row of
// watermill-sql's publisher, so the event enters the outbox exactly once
// whatever the service retries.
func Example_outbox() {
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
