package acceptance_test

import (
	"context"
	"database/sql"
	"errors"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/acceptance"
	sqlkeys "github.com/watermill-dedup/dedup/keyfuncs/sqlkeys/v4"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
)

// sqlPubSub4 is sqlPubSub on watermill-sql v4, with the same settings:
// its publisher and subscriber on database/sql (wsql.BeginnerFromStdSQL;
// on PostgreSQL through pgx's stdlib driver, as testkit opens it), the
// way a v4 subscriber's transaction can be joined (see
// stores/sqlstore/wsql4), and sqlkeys/v4 for the native producer's rows.
func sqlPubSub4(d sqlstore.Dialect) acceptance.Backend { return sqlPubSubOf(d, wsqlV4) }

var wsqlV4 = wsqlClients{
	prefix: "sql-v4-",
	initialize: func(db *sql.DB, d sqlstore.Dialect, topic string) error {
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), subscriberConfig4(d, ""), nil)
		if err != nil {
			return err
		}
		defer sub.Close()
		return sub.SubscribeInitialize(topic)
	},
	newPublisher: func(db *sql.DB, d sqlstore.Dialect) (message.Publisher, error) {
		return wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schemaAdapter4(d)}, testLogger())
	},
	newSubscriber: func(db *sql.DB, d sqlstore.Dialect, group string, foreign bool) (message.Subscriber, error) {
		cfg := subscriberConfig4(d, group)
		if foreign {
			cfg.SchemaAdapter = sqlkeys.SchemaAdapter{SchemaAdapter: cfg.SchemaAdapter}
		}
		return wsql4.NewSubscriber(db, cfg, testLogger())
	},
	copyKey: sqlkeys.Offset(),
}

// schemaAdapter4 and subscriberConfig4 are schemaAdapter and
// subscriberConfig for v4.
func schemaAdapter4(d sqlstore.Dialect) wsql.SchemaAdapter {
	if d == sqlstore.MySQL {
		return wsql.DefaultMySQLSchema{GeneratePayloadType: func(string) string { return "BLOB" }, SubscribeBatchSize: 20}
	}
	return wsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }, SubscribeBatchSize: 20}
}

func subscriberConfig4(d sqlstore.Dialect, group string) wsql.SubscriberConfig {
	v3 := subscriberConfig(d, group)
	cfg := wsql.SubscriberConfig{
		ConsumerGroup:  group,
		SchemaAdapter:  schemaAdapter4(d),
		PollInterval:   v3.PollInterval,
		ResendInterval: v3.ResendInterval,
		RetryInterval:  v3.RetryInterval,
		AckDeadline:    v3.AckDeadline,
	}
	if d == sqlstore.MySQL {
		cfg.OffsetsAdapter = wsql.DefaultMySQLOffsetsAdapter{}
	} else {
		cfg.OffsetsAdapter = wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	return cfg
}

// sqlStoreJoinedTx4 is sqlStoreJoinedTx on watermill-sql v4's subscriber
// transaction (JoinTx: wsql4.SubscriberTx).
func sqlStoreJoinedTx4(d sqlstore.Dialect) acceptance.Store {
	s := sqlStoreConfig(d, true, "tx-joined", sqlstore.Config{JoinTx: mustFind(wsql4.SubscriberTx)})
	s.JoinsSubscriberTx = true
	return s
}

// errNotJoined fails a Begin of a joining store that found no
// transaction to join.
var errNotJoined = errors.New("acceptance: a joining store found no watermill-sql subscriber transaction in the message's context (the wrong major's finder?)")

// mustFind is find, failing where it finds nothing: on a watermill-sql
// pub/sub every message's context carries the subscriber's transaction,
// and a joining row whose finder missed it would run every scenario in
// transactions of the store's own, and pass, without testing the join.
func mustFind(find sqlstore.TxFinder) sqlstore.TxFinder {
	return func(ctx context.Context) (*sql.Tx, error) {
		tx, err := find(ctx)
		if tx == nil && err == nil {
			return nil, errNotJoined
		}
		return tx, err
	}
}
