package acceptance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/sqlkeys"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
)

// sqlAckDeadline is how long the watermill-sql subscriber waits for an
// ack before it gives a delivery up and redelivers it, shorter than its
// 30s default so the lease expiry scenario's stalled handler is
// redelivered in time.
const sqlAckDeadline = 3 * time.Second

// sqlPubSub is watermill-sql on PostgreSQL or MySQL/MariaDB: a messages
// table per topic and an offsets table, consumer groups whose consumers
// take turns (the group's offset row is locked while a batch is handled),
// in order. Its database is the SQL stores' database, so the outage
// scenario cuts both, and sqlstore's transactional mode joins the
// subscriber's transaction: offset, dedup record and ledger commit
// together. This is watermill-sql v3; sqlPubSub4 is v4.
func sqlPubSub(d sqlstore.Dialect) acceptance.Backend { return sqlPubSubOf(d, wsqlV3) }

// wsqlClients are the clients of one watermill-sql major on a database.
type wsqlClients struct {
	// prefix begins the backend's name, before the dialect.
	prefix string
	// initialize creates topic's tables.
	initialize   func(db *sql.DB, d sqlstore.Dialect, topic string) error
	newPublisher func(db *sql.DB, d sqlstore.Dialect) (message.Publisher, error)
	// newSubscriber's subscriber is in group; foreign: set up for the
	// native producer's rows (sqlkeys' schema adapter).
	newSubscriber func(db *sql.DB, d sqlstore.Dialect, group string, foreign bool) (message.Subscriber, error)
	// copyKey is sqlkeys' Offset of the major.
	copyKey keyfuncs.KeyFunc
}

var wsqlV3 = wsqlClients{
	prefix: "sql-",
	initialize: func(db *sql.DB, d sqlstore.Dialect, topic string) error {
		sub, err := wsql.NewSubscriber(db, subscriberConfig(d, ""), nil)
		if err != nil {
			return err
		}
		defer sub.Close()
		return sub.SubscribeInitialize(topic)
	},
	newPublisher: func(db *sql.DB, d sqlstore.Dialect) (message.Publisher, error) {
		return wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter(d)}, testLogger())
	},
	newSubscriber: func(db *sql.DB, d sqlstore.Dialect, group string, foreign bool) (message.Subscriber, error) {
		cfg := subscriberConfig(d, group)
		if foreign {
			cfg.SchemaAdapter = sqlkeys.SchemaAdapter{SchemaAdapter: cfg.SchemaAdapter}
		}
		// Guarded, so that the store can join its transaction
		// (wsql3.SubscriberTx refuses the transaction of a subscriber
		// built by watermill-sql itself).
		return wsql3.NewSubscriber(db, cfg, testLogger())
	},
	copyKey: sqlkeys.Offset(),
}

// sqlPubSubOf is sqlPubSub on the clients of c.
func sqlPubSubOf(d sqlstore.Dialect, c wsqlClients) acceptance.Backend {
	// newSubscriber makes subscribers of c on a database connection of
	// their own, set up for the native producer's rows when foreign.
	newSubscriber := func(foreign bool) func(testing.TB, acceptance.Env, string) (message.Subscriber, error) {
		return func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			db, err := openSQL(d, env)
			if err != nil {
				return nil, err
			}
			// The subscriber holds one transaction at a time.
			db.SetMaxOpenConns(2)
			sub, err := c.newSubscriber(db, d, group, foreign)
			if err != nil {
				_ = db.Close()
				return nil, err
			}
			return &sqlSubscriber{Subscriber: sub, db: db}, nil
		}
	}
	return acceptance.Backend{
		Name: c.prefix + string(d),
		Features: acceptance.Features{
			ConsumerGroups: true,
			Persistent:     true,
			Ordered:        true,
			Restartable:    true,
		},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			return acceptance.Env{acceptance.EnvAddr: anystore.RequireStore(t, sqlKind(d))}, nil
		},
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			db, err := openSQL(d, env)
			if err != nil {
				return err
			}
			defer db.Close()
			// Create the tables once here: concurrent CREATE TABLE IF NOT
			// EXISTS by several subscribers can fail on PostgreSQL.
			if err := c.initialize(db, d, topic); err != nil {
				return err
			}
			t.Cleanup(func() {
				dropTables(t, d, env, "watermill_"+topic, "watermill_offsets_"+topic)
			})
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			db, err := openSQL(d, env)
			if err != nil {
				return nil, err
			}
			db.SetMaxOpenConns(2)
			pub, err := c.newPublisher(db, d)
			if err != nil {
				_ = db.Close()
				return nil, err
			}
			return &sqlPublisher{Publisher: pub, db: db}, nil
		},
		NewSubscriber: newSubscriber(false),
		Deadline:      &acceptance.Deadline{Name: fmt.Sprintf("watermill-sql AckDeadline %s, kept by the guarded subscriber (the batch's transaction rolled back, its messages delivered again)", sqlAckDeadline)},
		Native: &acceptance.Native{
			Client: "plain INSERTs (database/sql)",
			NewPublisher: func(_ testing.TB, env acceptance.Env) (acceptance.NativePublisher, error) {
				db, err := openSQL(d, env)
				if err != nil {
					return nil, err
				}
				db.SetMaxOpenConns(1)
				return &sqlProducer{db: db, d: d}, nil
			},
			// sqlkeys.SchemaAdapter carries each row's offset, for
			// sqlkeys.Offset.
			NewSubscriber: newSubscriber(true),
			Key:           keyfuncs.MessageID(),
			KeyName:       "keyfuncs.MessageID() (uuid column)",
			CopyKey:       c.copyKey,
			CopyKeyName:   "sqlkeys.Offset()",
			// watermill-sql does not deliver created_at: the producer
			// writes its time into the metadata, as sqlkeys advises.
			PublishedAt: middleware.MetadataTime(sqlPublishedAt),
		},
	}
}

// sqlPublishedAt is the metadata field in which the native producer
// writes its publish time (RFC 3339).
const sqlPublishedAt = "published_at"

// sqlProducer is a producer that is not Watermill: one plain INSERT per
// message into the topic's watermill-sql table, as sqlkeys documents
// (on PostgreSQL with transaction_id = pg_current_xact_id()), the
// producer's id in the uuid column and a metadata object of the
// producer's own with its publish time, or NULL metadata when it sets no
// time.
type sqlProducer struct {
	db *sql.DB
	d  sqlstore.Dialect
}

func (p *sqlProducer) Publish(topic string, m acceptance.NativeMessage) error {
	var metadata any // NULL
	if !m.At.IsZero() {
		metadata = fmt.Sprintf(`{"source": "billing", "content_type": "application/json", %q: %q}`,
			sqlPublishedAt, m.At.UTC().Format(time.RFC3339Nano))
	}
	var query string
	if p.d == sqlstore.MySQL {
		query = fmt.Sprintf("INSERT INTO `watermill_%s` (uuid, payload, metadata) VALUES (?, ?, ?)", topic)
	} else {
		query = fmt.Sprintf(`INSERT INTO "watermill_%s" (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())`, topic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := p.db.ExecContext(ctx, query, m.ID, m.Payload, metadata)
	return err
}

func (p *sqlProducer) Close() error { return p.db.Close() }

func schemaAdapter(d sqlstore.Dialect) wsql.SchemaAdapter {
	if d == sqlstore.MySQL {
		// Binary payloads: the bad-input scenario sends non-JSON ones.
		return wsql.DefaultMySQLSchema{GeneratePayloadType: func(string) string { return "BLOB" }, SubscribeBatchSize: 20}
	}
	return wsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }, SubscribeBatchSize: 20}
}

func subscriberConfig(d sqlstore.Dialect, group string) wsql.SubscriberConfig {
	deadline := sqlAckDeadline
	cfg := wsql.SubscriberConfig{
		ConsumerGroup:  group,
		SchemaAdapter:  schemaAdapter(d),
		PollInterval:   50 * time.Millisecond,
		ResendInterval: 20 * time.Millisecond,
		RetryInterval:  100 * time.Millisecond,
		AckDeadline:    &deadline,
	}
	if d == sqlstore.MySQL {
		cfg.OffsetsAdapter = wsql.DefaultMySQLOffsetsAdapter{}
	} else {
		cfg.OffsetsAdapter = wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	return cfg
}

// sqlPublisher and sqlSubscriber close their database with them.
type sqlPublisher struct {
	message.Publisher
	db *sql.DB
}

func (p *sqlPublisher) Close() error { return errors.Join(p.Publisher.Close(), p.db.Close()) }

type sqlSubscriber struct {
	message.Subscriber
	db   *sql.DB
	once sync.Once
	err  error
}

// Close is safe to call twice, from the router and from the suite
// (watermill-sql's is not).
func (s *sqlSubscriber) Close() error {
	s.once.Do(func() { s.err = errors.Join(s.Subscriber.Close(), s.db.Close()) })
	return s.err
}
