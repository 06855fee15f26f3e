package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestWatermillSQLv4SubscriberTx is TestWatermillSQLSubscriberTx on
// watermill-sql v4, whose subscriber puts its wsql.Tx in the message's
// context, with wsql4.SubscriberTx as the store's JoinTx: on MySQL
// through database/sql (wsql.BeginnerFromStdSQL), on PostgreSQL through
// database/sql over a pgx pool (stdlib.OpenDBFromPool), the way a pgx
// user's subscriber joins. v4 resends a nacked message inside the same
// transaction too.
func TestWatermillSQLv4SubscriberTx(t *testing.T) {
	forEachBackend(t, serverBackends, func(t *testing.T, b backend) { testSubscriberTx(t, b, wsqlV4) })
}

var wsqlV4 = wsqlMajor{
	joinTx: wsql4.SubscriberTx,
	pubSub: func(t *testing.T, db *sql.DB, d sqlstore.Dialect, ack time.Duration, opts ...pubSubOption) (message.Publisher, message.Subscriber) {
		o := newPubSubOptions(opts)
		schema, offsets := wsql4Adapters(d)
		switch {
		case o.queue && d == sqlstore.MySQL:
			schema, offsets = wsql.MySQLQueueSchema{SubscribeBatchSize: o.batch}, wsql.MySQLQueueOffsetsAdapter{}
		case o.queue:
			schema, offsets = wsql.PostgreSQLQueueSchema{SubscribeBatchSize: o.batch}, wsql.PostgreSQLQueueOffsetsAdapter{}
		case d == sqlstore.MySQL:
			schema = wsql.DefaultMySQLSchema{SubscribeBatchSize: o.batch}
		default:
			schema = wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: o.batch}
		}
		group := "dedup-test"
		if o.queue {
			group = "" // the queue adapters have no consumer groups
		}
		if d == sqlstore.Postgres {
			db = stdlib.OpenDBFromPool(newPgxPool(t))
			t.Cleanup(func() { _ = db.Close() })
		}
		return wsql4PubSub(t, db, group, schema, offsets, ack)
	},
	subscriberTx: func(ctx context.Context) (*sql.Tx, bool) {
		tx, ok := wsql.TxFromContext(ctx)
		if std, isStd := tx.(*wsql.StdSQLTx); ok && isStd {
			return std.Tx, true
		}
		return nil, false
	},
}

func wsql4Adapters(d sqlstore.Dialect) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if d == sqlstore.MySQL {
		return wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
	}
	return wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
}

// wsql4PubSub returns a v4 publisher and a guarded subscriber on db, as
// wsqlMajor.pubSub documents.
func wsql4PubSub(t *testing.T, db *sql.DB, group string, schema wsql.SchemaAdapter, offsets wsql.OffsetsAdapter, ack time.Duration) (message.Publisher, message.Subscriber) {
	logger := watermill.NopLogger{}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql4.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   time.Millisecond,
		AckDeadline:      &ack,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// wsql4PlainPubSub is a v4 publisher and a subscriber as watermill-sql
// builds them, on beginner, without the guard wsql4.NewSubscriber adds.
func wsql4PlainPubSub(t *testing.T, beginner wsql.Beginner, schema wsql.SchemaAdapter, offsets wsql.OffsetsAdapter) (message.Publisher, message.Subscriber) {
	logger := watermill.NopLogger{}
	pub, err := wsql.NewPublisher(beginner, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(beginner, wsql.SubscriberConfig{
		ConsumerGroup:    "dedup-test",
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return pub, sub
}

func newPgxPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testkit.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestWatermillSQLv4PgxTxRefused: a v4 subscriber on pgx itself
// (wsql.BeginnerFromPgx) carries a pgx transaction, which a store on
// database/sql cannot run its statements in. With wsql4.SubscriberTx as
// JoinTx, Begin refuses it (wsql4.ErrNotDatabaseSQL, a
// stores.ErrInvalidArgument) and writes nothing, rather than opening a
// transaction of its own beside the one the handler writes in; the
// transactional publisher refuses it too and publishes nothing. Without
// JoinTx the store opens its own inbox transaction, as documented for
// such a subscriber.
func TestWatermillSQLv4PgxTxRefused(t *testing.T) {
	db := openPostgres(t)
	joining := newStore(t, db, sqlstore.Postgres, sqlstore.Config{JoinTx: wsql4.SubscriberTx})
	own := newStore(t, db, sqlstore.Postgres, sqlstore.Config{Table: joining.Table()})
	topic := "dedup_" + storetest.NewID()
	t.Cleanup(func() {
		dropTable(t, db, sqlstore.Postgres, "watermill_"+topic)
		dropTable(t, db, sqlstore.Postgres, "watermill_offsets_"+topic)
	})
	schema, offsets := wsql4Adapters(sqlstore.Postgres)
	pub, sub := wsql4PlainPubSub(t, wsql.BeginnerFromPgx(newPgxPool(t)), schema, offsets)
	defer pub.Close()
	defer sub.Close()
	if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	msg := <-msgs
	if tx, ok := wsql.TxFromContext(msg.Context()); !ok {
		t.Fatal("the v4 message context carries no transaction")
	} else if _, isPgx := tx.(*wsql.PgxTx); !isPgx {
		t.Fatalf("the subscriber's transaction is a %T, want a *wsql.PgxTx", tx)
	}

	_, err = joining.Begin(msg.Context(), "scope", []string{"k"}, time.Hour)
	if !errors.Is(err, wsql4.ErrNotDatabaseSQL) || !errors.Is(err, stores.ErrInvalidArgument) {
		t.Fatalf("Begin in a pgx transaction = %v, want wsql4.ErrNotDatabaseSQL and stores.ErrInvalidArgument", err)
	}
	t.Logf("Begin: %v", err)
	if _, ok := joining.JoinedTx(msg.Context()); !ok {
		t.Error("JoinedTx reports no transaction: a caller would take Begin for one opening its own")
	}
	if n := countRows(t, db, sqlstore.Postgres, joining.Table()); n != 0 {
		t.Fatalf("%d records written by a refused Begin", n)
	}

	dp, err := publisher.New(publisher.Config{Store: joining, Mode: dedup.ModeTransactional, Key: keyfuncs.MessageID(), Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	outbox, err := dp.Decorate(publisherFunc(func(string, ...*message.Message) error { sent++; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	out := message.NewMessage(watermill.NewUUID(), nil)
	out.SetContext(msg.Context())
	if err := outbox.Publish("out", out); !errors.Is(err, wsql4.ErrNotDatabaseSQL) || sent != 0 {
		t.Fatalf("transactional publish in a pgx transaction = %v with %d sent, want wsql4.ErrNotDatabaseSQL and nothing sent", err, sent)
	}

	// Without JoinTx: an inbox transaction of the store's own.
	itx, err := own.Begin(msg.Context(), "scope", []string{"k"}, time.Hour)
	if err != nil || itx.Result() != stores.Claimed {
		t.Fatalf("Begin without JoinTx = %v, %v; want a claim in a transaction of the store's own", itx, err)
	}
	if tx, _ := sqlstore.TxFromContext(itx.Context(msg.Context())); tx == nil {
		t.Fatal("the inbox transaction is not in the handler's context")
	}
	if err := itx.Commit(msg.Context(), nil); err != nil {
		t.Fatal(err)
	}
	msg.Ack()
	if n := countRows(t, db, sqlstore.Postgres, joining.Table()); n != 1 {
		t.Fatalf("%d records after the store's own transaction committed, want 1", n)
	}
}

// publisherFunc is a message.Publisher of a function.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (publisherFunc) Close() error { return nil }
