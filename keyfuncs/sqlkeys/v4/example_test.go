package sqlkeys_test

import (
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/watermill-dedup/dedup/keyfuncs"
	sqlkeys "github.com/watermill-dedup/dedup/keyfuncs/sqlkeys/v4"
)

// Rows another producer inserts carry its event id in the uuid column:
// the default key, keyfuncs.MessageID(), reads it. With a fresh uuid per
// insert, key by the row (redeliveries) and by business fields
// (republishes) instead. The subscriber may be on database/sql
// (wsql.BeginnerFromStdSQL) or on pgx (wsql.BeginnerFromPgx).
func ExampleOffset() {
	cfg := wsql.SubscriberConfig{
		ConsumerGroup:  "payments",
		SchemaAdapter:  sqlkeys.SchemaAdapter{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}
	key := keyfuncs.All(
		keyfuncs.Prefix("row:", sqlkeys.Offset()),
		keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id", "operation")),
	)
	_, _ = cfg, key // wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), cfg, logger); middleware.Config{Key: key}
}
