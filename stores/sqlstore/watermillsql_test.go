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
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

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
// watermill-sql v3 resends a nacked message inside the same transaction
// without rolling it back (Watermill issue #224): the test fails the first
// attempt of every tenth event after its ledger write and checks that the
// resend runs in the same transaction and that the rollback to the
// attempt's savepoint undid the write (the ledger sum is exact).
// watermillsql4_test.go runs the same on watermill-sql v4.
func TestWatermillSQLSubscriberTx(t *testing.T) {
	forEachBackend(t, serverBackends, func(t *testing.T, b backend) { testSubscriberTx(t, b, wsqlV3) })
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
		schema, offsets := wsql.SchemaAdapter(wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: o.batch}), wsql.OffsetsAdapter(wsql.DefaultPostgreSQLOffsetsAdapter{})
		if d == sqlstore.MySQL {
			schema, offsets = wsql.DefaultMySQLSchema{SubscribeBatchSize: o.batch}, wsql.DefaultMySQLOffsetsAdapter{}
		}
		logger := watermill.NopLogger{}
		pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := wsql3.NewSubscriber(db, wsql.SubscriberConfig{
			ConsumerGroup:    "dedup-test",
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
	},
	subscriberTx: wsql.TxFromContext,
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

// testSubscriberTx is TestWatermillSQLSubscriberTx on b with w.
func testSubscriberTx(t *testing.T, b backend, w wsqlMajor) {
	db := b.open(t)
	s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: w.joinTx})
	l := newLedger(t, db, b.dialect, 4)
	topic := "dedup_" + storetest.NewID()
	t.Cleanup(func() {
		dropTable(t, db, b.dialect, "watermill_"+topic)
		dropTable(t, db, b.dialect, "watermill_offsets_"+topic)
	})
	pub, sub := w.pubSub(t, db, b.dialect, 5*time.Second)
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
		if err := l.add(hctx, tx, ev%4, amount); err != nil {
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
	for deadline := time.Now().Add(time.Minute); countRows(t, db, b.dialect, s.Table()) < events && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	if got := l.sum(t, db); got != want {
		t.Errorf("ledger sum = %d, want %d", got, want)
	}
	if got := countRows(t, db, b.dialect, s.Table()); got != events {
		t.Errorf("inbox rows = %d, want %d", got, events)
	}
	if int(duplicates.Load()) != deliveries-events {
		t.Errorf("%d duplicates, want %d", duplicates.Load(), deliveries-events)
	}
	if resendsInSameTx.Load() == 0 {
		t.Error("no nacked message was resent in the same transaction: the test did not exercise Watermill issue #224")
	}
	t.Logf("%s: %d deliveries, %d duplicates, %d of %d failed attempts resent in the same subscriber transaction",
		b.dialect, deliveries, duplicates.Load(), resendsInSameTx.Load(), len(failedTx))
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
	forEachBackend(t, backends[2:], func(t *testing.T, b backend) {
		db := b.open(t)
		ctx := context.Background()
		for _, f := range []sqlstore.TxFinder{wsql3.SubscriberTx, wsql4.SubscriberTx} {
			s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: f})
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
		s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: func(context.Context) (*sql.Tx, error) { return nil, refusal }})
		if _, err := s.Begin(ctx, "scope", []string{"k"}, time.Hour); !errors.Is(err, sqlstore.ErrTxNotJoinable) || !errors.Is(err, refusal) {
			t.Fatalf("Begin refused by JoinTx = %v, want ErrTxNotJoinable and the finder's error", err)
		}
		tx1, ok1 := s.JoinedTx(ctx)
		tx2, ok2 := s.JoinedTx(ctx)
		if !ok1 || !ok2 || tx1 != tx2 {
			t.Fatalf("JoinedTx of a refused transaction = %v %v, %v %v; want it reported, equal each time", tx1, ok1, tx2, ok2)
		}
		if n := countRows(t, db, b.dialect, s.Table()); n != 0 {
			t.Fatalf("%d records after a refused Begin", n)
		}
	})
}
