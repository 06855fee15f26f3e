package publisher_test

import (
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
)

// TestTransactionalOutboxV4 is TestTransactionalOutbox with watermill-sql
// v4's publisher as the outbox: on the caller's *sql.Tx through
// wsql.TxFromStdSQL, the record joining the same transaction
// (sqlstore.WithTx).
func TestTransactionalOutboxV4(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) { testTransactionalOutbox(t, newOutboxOf(t, kind, sqlV4)) })
}

var sqlV4 = sqlMajor{
	initialize: func(t *testing.T, db *sql.DB, kind anystore.StoreKind, topic string) []string {
		schema, offsets := sqlAdapters4(kind)
		init, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{ConsumerGroup: "readers", SchemaAdapter: schema, OffsetsAdapter: offsets}, watermill.NopLogger{})
		initializeTopic(t, init, err, topic)
		return topicTables(schema, offsets, topic)
	},
	publisher: func(db *sql.DB, tx *sql.Tx, kind anystore.StoreKind) (message.Publisher, error) {
		schema, _ := sqlAdapters4(kind)
		if tx == nil {
			return wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
		}
		return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	},
}

func sqlAdapters4(kind anystore.StoreKind) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if kind == anystore.StorePostgres {
		return wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	return wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
}
