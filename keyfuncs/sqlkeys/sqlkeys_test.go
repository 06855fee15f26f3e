package sqlkeys_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/keyfuncs/sqlkeys"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

type dialect struct {
	name    string
	mysql   bool
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	table   func(topic string) string
}

var dialects = []dialect{
	{"postgres", false,
		wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}, func(topic string) string { return `"watermill_` + topic + `"` }},
	{"mysql", true,
		wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}, func(topic string) string { return "`watermill_" + topic + "`" }},
}

// TestForeignRows: a producer that is not Watermill inserts rows into a
// watermill-sql topic with plain SQL: one event twice under its own id in
// the uuid column (a retried INSERT), one under a fresh random id each
// time. The middleware's default key runs the first event once; Offset
// keys every row apart, by topic and offset.
func TestForeignRows(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			db, _ := sqltest.OpenSQL(t, d.mysql)
			topic := "sqlkeys_" + storetest.NewID()
			sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
				ConsumerGroup:  "g",
				SchemaAdapter:  sqlkeys.SchemaAdapter{SchemaAdapter: d.schema},
				OffsetsAdapter: d.offsets,
				PollInterval:   20 * time.Millisecond,
			}, watermill.NopLogger{})
			sqltest.InitializeTopic(t, db, d.mysql, sub, err, topic, d.table(topic), d.table("offsets_"+topic))

			// The foreign producer.
			insert := fmt.Sprintf("INSERT INTO %s (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())", d.table(topic))
			if d.mysql {
				insert = fmt.Sprintf("INSERT INTO %s (uuid, payload, metadata) VALUES (?, ?, ?)", d.table(topic))
			}
			keytest.ForeignRows(t, db, insert, sub, topic, sqlkeys.Offset())
		})
	}
}

func TestOffsetWithoutARow(t *testing.T) { keytest.OffsetWithoutARow(t, sqlkeys.Offset()) }
