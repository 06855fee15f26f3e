package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql3std "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4std "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestWatermillSQLSubscriberTx consumes from a real watermill-sql
// subscriber, whose message context carries the transaction that also
// acks the offset. Begin joins it with a SAVEPOINT, so offset ack, dedup
// record and ledger write commit together.
//
// watermill-sql resends a nacked message inside the same transaction
// without rolling it back (Watermill issue #224): the test fails the first
// attempt of every tenth event after its ledger write and checks that the
// resend runs in the same transaction and that the rollback to the
// attempt's savepoint undid the write (the ledger sum is exact).
//
// It runs on each major (forEachJoinedPubSub). v4's subscriber puts its
// wsql.Tx in the message's context, with wsql4.SubscriberTx as the
// store's JoinTx: on MySQL through database/sql
// (wsql.BeginnerFromStdSQL), on PostgreSQL through database/sql over a
// pgx pool (stdlib.OpenDBFromPool), the way a pgx user's subscriber
// joins.
func TestWatermillSQLSubscriberTx(t *testing.T) {
	forEachJoinedPubSub(t, testSubscriberTx)
}

// wsqlMajor is a major of watermill-sql as testSubscriberTx uses it.
type wsqlMajor struct {
	// joinTx is the store's Config.JoinTx.
	joinTx sqlstore.TxFinder
	// pubSub returns a publisher and a guarded subscriber (of consumer
	// group "dedup-test", with ack as its AckDeadline) on the database of
	// db.
	pubSub func(t *testing.T, db *sql.DB, d sqlstore.Dialect, ack time.Duration, opts ...pubSubOption) (message.Publisher, message.Subscriber)
	// subscriberTx is the *sql.Tx a message's context carries from the
	// subscriber.
	subscriberTx func(ctx context.Context) (*sql.Tx, bool)
}

var wsqlV3 = wsqlMajor{
	joinTx: wsql3.SubscriberTx,
	pubSub: func(t *testing.T, db *sql.DB, d sqlstore.Dialect, ack time.Duration, opts ...pubSubOption) (message.Publisher, message.Subscriber) {
		o := newPubSubOptions(opts)
		if o.queue {
			t.Fatal("watermill-sql v3 has no queue adapters")
		}
		return wsql3PubSub(t, db, d, o.batch, &ack)
	},
	subscriberTx: wsql3std.TxFromContext,
}

// wsql3PubSub returns a v3 publisher and a subscriber (of consumer group
// "dedup-test", its schema adapter's SubscribeBatchSize batch) on db: a
// guarded one with ack as its AckDeadline, or with ack nil one as
// watermill-sql builds it, without the guard wsql3.NewSubscriber adds,
// which t.Cleanup closes.
func wsql3PubSub(t *testing.T, db *sql.DB, d sqlstore.Dialect, batch int, ack *time.Duration) (message.Publisher, message.Subscriber) {
	schema, offsets := wsql3std.SchemaAdapter(wsql3std.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}), wsql3std.OffsetsAdapter(wsql3std.DefaultPostgreSQLOffsetsAdapter{})
	if d == sqlstore.MySQL {
		schema, offsets = wsql3std.DefaultMySQLSchema{SubscribeBatchSize: batch}, wsql3std.DefaultMySQLOffsetsAdapter{}
	}
	logger := watermill.NopLogger{}
	pub, err := wsql3std.NewPublisher(db, wsql3std.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg := wsql3std.SubscriberConfig{
		ConsumerGroup:    "dedup-test",
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}
	if ack == nil {
		sub, err := wsql3std.NewSubscriber(db, cfg, logger)
		return pub, plainSubscriber(t, sub, err)
	}
	cfg.ResendInterval, cfg.AckDeadline = time.Millisecond, ack
	sub, err := wsql3.NewSubscriber(db, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// plainSubscriber returns sub, which t.Cleanup closes, unless err.
func plainSubscriber(t *testing.T, sub message.Subscriber, err error) message.Subscriber {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// pubSubOption sets up wsqlMajor.pubSub's clients.
type pubSubOption func(*pubSubOptions)

type pubSubOptions struct {
	batch int  // SubscribeBatchSize; 0: the adapter's default
	queue bool // v4's queue adapters, without consumer groups
}

// wsqlBatch sets the schema adapter's SubscribeBatchSize.
func wsqlBatch(n int) pubSubOption { return func(o *pubSubOptions) { o.batch = n } }

// wsqlQueue uses watermill-sql v4's queue adapters.
func wsqlQueue() pubSubOption { return func(o *pubSubOptions) { o.queue = true } }

func newPubSubOptions(opts []pubSubOption) pubSubOptions {
	var o pubSubOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

var wsqlV4 = wsqlMajor{
	joinTx: wsql4.SubscriberTx,
	pubSub: func(t *testing.T, db *sql.DB, d sqlstore.Dialect, ack time.Duration, opts ...pubSubOption) (message.Publisher, message.Subscriber) {
		o := newPubSubOptions(opts)
		var schema wsql4std.SchemaAdapter
		var offsets wsql4std.OffsetsAdapter
		switch {
		case o.queue && d == sqlstore.MySQL:
			schema, offsets = wsql4std.MySQLQueueSchema{SubscribeBatchSize: o.batch}, wsql4std.MySQLQueueOffsetsAdapter{}
		case o.queue:
			schema, offsets = wsql4std.PostgreSQLQueueSchema{SubscribeBatchSize: o.batch}, wsql4std.PostgreSQLQueueOffsetsAdapter{}
		case d == sqlstore.MySQL:
			schema, offsets = wsql4std.DefaultMySQLSchema{SubscribeBatchSize: o.batch}, wsql4std.DefaultMySQLOffsetsAdapter{}
		default:
			schema, offsets = wsql4std.DefaultPostgreSQLSchema{SubscribeBatchSize: o.batch}, wsql4std.DefaultPostgreSQLOffsetsAdapter{}
		}
		group := "dedup-test"
		if o.queue {
			group = "" // the queue adapters have no consumer groups
		}
		if d == sqlstore.Postgres {
			db = stdlib.OpenDBFromPool(newPgxPool(t))
			t.Cleanup(func() { _ = db.Close() })
		}
		return wsql4PubSub(t, wsql4std.BeginnerFromStdSQL(db), group, schema, offsets, &ack)
	},
	subscriberTx: func(ctx context.Context) (*sql.Tx, bool) {
		tx, ok := wsql4std.TxFromContext(ctx)
		if std, isStd := tx.(*wsql4std.StdSQLTx); ok && isStd {
			return std.Tx, true
		}
		return nil, false
	},
}

// wsql4PubSub returns a v4 publisher and a subscriber (of consumer group
// group, none for the queue adapters) on beginner: a guarded one with ack
// as its AckDeadline (beginner on database/sql), or with ack nil one as
// watermill-sql builds it, without the guard wsql4.NewSubscriber adds,
// which t.Cleanup closes.
func wsql4PubSub(t *testing.T, beginner wsql4std.Beginner, group string, schema wsql4std.SchemaAdapter, offsets wsql4std.OffsetsAdapter, ack *time.Duration) (message.Publisher, message.Subscriber) {
	logger := watermill.NopLogger{}
	pub, err := wsql4std.NewPublisher(beginner, wsql4std.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg := wsql4std.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}
	if ack == nil {
		sub, err := wsql4std.NewSubscriber(beginner, cfg, logger)
		return pub, plainSubscriber(t, sub, err)
	}
	std, ok := beginner.(wsql4std.StdSQLBeginner)
	if !ok {
		t.Fatalf("a guarded subscriber runs on database/sql, not on a %T", beginner)
	}
	cfg.ResendInterval, cfg.AckDeadline = time.Millisecond, ack
	sub, err := wsql4.NewSubscriber(std.SQLBeginner, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// wsql4PlainPubSub is wsql4PubSub unguarded, on PostgreSQL's default
// adapters.
func wsql4PlainPubSub(t *testing.T, beginner wsql4std.Beginner) (message.Publisher, message.Subscriber) {
	return wsql4PubSub(t, beginner, "dedup-test", wsql4std.DefaultPostgreSQLSchema{}, wsql4std.DefaultPostgreSQLOffsetsAdapter{}, nil)
}

// newWsqlTopic returns a new topic, whose watermill-sql tables on db
// t.Cleanup drops.
func newWsqlTopic(t *testing.T, db *sql.DB, d sqlstore.Dialect) string {
	topic := "dedup_" + storetest.NewID()
	t.Cleanup(func() {
		sqltest.DropTable(t, db, d, "watermill_"+topic)
		sqltest.DropTable(t, db, d, "watermill_offsets_"+topic)
	})
	return topic
}

// subscribe subscribes sub to topic until the test ends.
func subscribe(t *testing.T, sub message.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// deliverOne publishes a message of payload on topic with pub and returns
// it as sub delivers it.
func deliverOne(t *testing.T, pub message.Publisher, sub message.Subscriber, topic string, payload []byte) *message.Message {
	t.Helper()
	if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
		t.Fatal(err)
	}
	return <-subscribe(t, sub, topic)
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

// testSubscriberTx is TestWatermillSQLSubscriberTx on b with w.
func testSubscriberTx(t *testing.T, b sqltest.Backend, w wsqlMajor) {
	db := b.Open(t)
	s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{JoinTx: w.joinTx})
	l := sqltest.NewLedger(t, db, b.Dialect, 4)
	topic := newWsqlTopic(t, db, b.Dialect)
	pub, sub := w.pubSub(t, db, b.Dialect, 5*time.Second)
	defer pub.Close()

	const events = 120
	var want int64
	deliveries := 0
	for i := range events {
		amount := i%7 + 1
		want += int64(amount)
		for range 1 + i%3 { // each event published 1-3 times, under new message ids
			m := message.NewMessage(watermill.NewUUID(), []byte(`{"event":`+strconv.Itoa(i)+`}`))
			m.Metadata.Set("event_id", strconv.Itoa(i))
			m.Metadata.Set("amount", strconv.Itoa(amount))
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
			deliveries++
		}
	}

	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}

	scope := "wsql-" + topic
	failedTx := map[int]any{} // event -> the subscriber tx its failed attempt ran in
	var acked, duplicates, resendsInSameTx atomic.Int64
	for acked.Load() < int64(deliveries) {
		var msg *message.Message
		select {
		case msg = <-msgs:
		case <-ctx.Done():
			t.Fatalf("timed out after %d of %d acks", acked.Load(), deliveries)
		}
		subTx, ok := w.subscriberTx(msg.Context())
		if !ok {
			t.Fatal("the watermill-sql message context carries no transaction")
		}
		ev, _ := strconv.Atoi(msg.Metadata.Get("event_id"))
		amount, _ := strconv.Atoi(msg.Metadata.Get("amount"))
		itx, err := s.Begin(msg.Context(), scope, []string{msg.Metadata.Get("event_id")}, time.Hour)
		if err != nil {
			t.Logf("Begin: %v (nack)", err)
			msg.Nack()
			continue
		}
		if itx.Result() == stores.Duplicate {
			if string(itx.Data()) != "done "+strconv.Itoa(ev) {
				t.Fatalf("duplicate data %q", itx.Data())
			}
			duplicates.Add(1)
			acked.Add(1)
			msg.Ack()
			continue
		}
		hctx := itx.Context(msg.Context())
		tx, _ := sqlstore.TxFromContext(hctx)
		if tx != subTx {
			t.Fatal("the handler's transaction is not the subscriber's")
		}
		if err := l.Add(hctx, tx, ev%4, amount); err != nil {
			t.Fatal(err)
		}
		if prev, seen := failedTx[ev]; ev%10 == 0 && !seen {
			failedTx[ev] = subTx
			if err := itx.Rollback(hctx); err != nil {
				t.Fatal(err)
			}
			msg.Nack() // resent inside the same transaction
			continue
		} else if seen && prev == subTx {
			resendsInSameTx.Add(1)
		}
		if err := itx.Commit(hctx, []byte("done "+strconv.Itoa(ev))); err != nil {
			t.Fatal(err)
		}
		acked.Add(1)
		msg.Ack()
	}
	// The subscriber commits its transaction (offset ack, records,
	// ledger) after the batch's last ack: wait for it before closing,
	// which would roll the batch back.
	for deadline := time.Now().Add(time.Minute); sqltest.CountRows(t, db, b.Dialect, s.Table()) < events && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	if got := l.Sum(t, db); got != want {
		t.Errorf("ledger sum = %d, want %d", got, want)
	}
	if got := sqltest.CountRows(t, db, b.Dialect, s.Table()); got != events {
		t.Errorf("inbox rows = %d, want %d", got, events)
	}
	if int(duplicates.Load()) != deliveries-events {
		t.Errorf("%d duplicates, want %d", duplicates.Load(), deliveries-events)
	}
	if resendsInSameTx.Load() == 0 {
		t.Error("no nacked message was resent in the same transaction: the test did not exercise Watermill issue #224")
	}
	t.Logf("%s: %d deliveries, %d duplicates, %d of %d failed attempts resent in the same subscriber transaction",
		b.Dialect, deliveries, duplicates.Load(), resendsInSameTx.Load(), len(failedTx))
}

// TestJoinWatermillTxNeedsJoinTx: the deprecated JoinWatermillTx alone
// no longer finds a transaction (sqlstore imports no watermill-sql
// major), and New refuses it, naming the fix, rather than let Begin open
// transactions of its own where a handler expects the subscriber's.
func TestJoinWatermillTxNeedsJoinTx(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.SQLite, JoinWatermillTx: true})
	if err == nil || !strings.Contains(err.Error(), "wsql3.SubscriberTx") || !strings.Contains(err.Error(), "wsql4.SubscriberTx") {
		t.Fatalf("New with JoinWatermillTx alone = %v, want a refusal naming JoinTx's finders", err)
	}
	for _, f := range []sqlstore.TxFinder{wsql3.SubscriberTx, wsql4.SubscriberTx} {
		s, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.SQLite, JoinWatermillTx: true, JoinTx: f})
		if err != nil {
			t.Fatalf("New with JoinWatermillTx and JoinTx: %v", err)
		}
		_ = s.Close(context.Background())
	}
}

// TestJoinTxNone: a finder that finds nothing leaves Begin to open its
// own transaction; one that refuses fails Begin with ErrTxNotJoinable and
// its own error, and JoinedTx reports the refusal as a transaction (equal
// for equal refusals), not as none.
func TestJoinTxNone(t *testing.T) {
	sqltest.ForEachBackend(t, backends[2:], func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		ctx := context.Background()
		for _, f := range []sqlstore.TxFinder{wsql3.SubscriberTx, wsql4.SubscriberTx} {
			s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{JoinTx: f})
			if _, ok := s.JoinedTx(ctx); ok {
				t.Fatal("JoinedTx of a context without a transaction reports one")
			}
			itx, err := s.Begin(ctx, "scope", []string{"k"}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := itx.Commit(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		refusal := errors.New("a transaction of another kind")
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{JoinTx: func(context.Context) (*sql.Tx, error) { return nil, refusal }})
		if _, err := s.Begin(ctx, "scope", []string{"k"}, time.Hour); !errors.Is(err, sqlstore.ErrTxNotJoinable) || !errors.Is(err, refusal) {
			t.Fatalf("Begin refused by JoinTx = %v, want ErrTxNotJoinable and the finder's error", err)
		}
		tx1, ok1 := s.JoinedTx(ctx)
		tx2, ok2 := s.JoinedTx(ctx)
		if !ok1 || !ok2 || tx1 != tx2 {
			t.Fatalf("JoinedTx of a refused transaction = %v %v, %v %v; want it reported, equal each time", tx1, ok1, tx2, ok2)
		}
		if n := sqltest.CountRows(t, db, b.Dialect, s.Table()); n != 0 {
			t.Fatalf("%d records after a refused Begin", n)
		}
	})
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
	db := sqltest.OpenPostgres(t)
	joining := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{JoinTx: wsql4.SubscriberTx})
	own := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{Table: joining.Table()})
	topic := newWsqlTopic(t, db, sqlstore.Postgres)
	pub, sub := wsql4PlainPubSub(t, wsql4std.BeginnerFromPgx(newPgxPool(t)))
	defer pub.Close()
	msg := deliverOne(t, pub, sub, topic, []byte(`{}`))
	if tx, ok := wsql4std.TxFromContext(msg.Context()); !ok {
		t.Fatal("the v4 message context carries no transaction")
	} else if _, isPgx := tx.(*wsql4std.PgxTx); !isPgx {
		t.Fatalf("the subscriber's transaction is a %T, want a *wsql.PgxTx", tx)
	}

	_, err := joining.Begin(msg.Context(), "scope", []string{"k"}, time.Hour)
	if !errors.Is(err, wsql4.ErrNotDatabaseSQL) || !errors.Is(err, stores.ErrInvalidArgument) {
		t.Fatalf("Begin in a pgx transaction = %v, want wsql4.ErrNotDatabaseSQL and stores.ErrInvalidArgument", err)
	}
	t.Logf("Begin: %v", err)
	if _, ok := joining.JoinedTx(msg.Context()); !ok {
		t.Error("JoinedTx reports no transaction: a caller would take Begin for one opening its own")
	}
	if n := sqltest.CountRows(t, db, sqlstore.Postgres, joining.Table()); n != 0 {
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
	if n := sqltest.CountRows(t, db, sqlstore.Postgres, joining.Table()); n != 1 {
		t.Fatalf("%d records after the store's own transaction committed, want 1", n)
	}
}

// publisherFunc is a message.Publisher of a function.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (publisherFunc) Close() error { return nil }
