package kafkakeys_test

import (
	"context"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// Records from a producer that is not Watermill have no Watermill UUID.
// Key them by their coordinates (a redelivery of the same record) and by
// the event's business fields (a producer that sends the event again),
// and check their age against the retention window by the record
// timestamp.
func ExampleRecordKey() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
	mw, err := middleware.New(middleware.Config{
		Store: store,
		Key: keyfuncs.All(
			keyfuncs.Prefix("record:", kafkakeys.KafkaOffset()),
			keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id", "operation")),
			// Or, when the producer keys each record by the event's own
			// id: keyfuncs.Prefix("key:", kafkakeys.RecordKey()).
		),
		PublishedAt: kafkakeys.PublishedAt,
	})
	if err != nil {
		panic(err)
	}
	_ = mw // router.AddMiddleware(mw.Middleware)
}
