package publisher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// outbox is a watermill-sql topic on a database, with a dedup store on
// the same database, for the outbox pattern.
type outbox struct {
	db     *sql.DB
	kind   anystore.StoreKind
	schema wsql.SchemaAdapter // v3's; nil on another major
	table  string             // the topic's messages table, quoted
	topic  string
	d      *publisher.Decorator
	store  *sqlstore.Store
	// publisher is the major's publisher on tx, or on db when tx is nil.
	publisher func(tx *sql.Tx) (message.Publisher, error)
}

// sqlMajor is a major of watermill-sql as the outbox uses it.
type sqlMajor struct {
	// initialize creates the topic's tables on db (a publisher on a
	// transaction cannot) and returns them, quoted, the messages table
	// first.
	initialize func(t *testing.T, db *sql.DB, kind anystore.StoreKind, topic string) []string
	// publisher is the major's publisher on tx, or on db when tx is nil.
	publisher func(db *sql.DB, tx *sql.Tx, kind anystore.StoreKind) (message.Publisher, error)
}

var sqlV3 = sqlMajor{
	initialize: func(t *testing.T, db *sql.DB, kind anystore.StoreKind, topic string) []string {
		schema, offsets := sqlAdapters(kind)
		init, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{ConsumerGroup: "readers", SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true}, watermill.NopLogger{})
		initializeTopic(t, init, err, topic)
		return topicTables(schema, offsets, topic)
	},
	publisher: func(db *sql.DB, tx *sql.Tx, kind anystore.StoreKind) (message.Publisher, error) {
		schema, _ := sqlAdapters(kind)
		if tx == nil {
			return wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
		}
		return wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	},
}

// initializeTopic creates topic's tables with init, a subscriber of any
// major whose construction returned err, and closes it.
func initializeTopic(t *testing.T, init message.Subscriber, err error, topic string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := init.(message.SubscribeInitializer).SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	_ = init.Close()
}

func newOutbox(t *testing.T, kind anystore.StoreKind) *outbox {
	o := newOutboxOf(t, kind, sqlV3)
	o.schema, _ = sqlAdapters(kind)
	return o
}

func newOutboxOf(t *testing.T, kind anystore.StoreKind, m sqlMajor) *outbox {
	ctx := context.Background()
	db := openDB(t, kind)
	dialect, _ := kind.SQLDialect()
	table := testkit.UniqueName("dedup_")
	store, err := sqlstore.New(db, sqlstore.Config{Dialect: dialect, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	topic := testkit.UniqueName("outbox_")
	tables := m.initialize(t, db, kind, topic)
	t.Cleanup(func() {
		_ = store.Close(ctx)
		if err := sqltest.DropTables(context.Background(), db, dialect, append([]string{table}, tables...)...); err != nil {
			t.Error(err)
		}
	})
	d, err := publisher.New(publisher.Config{
		Store:  store,
		Mode:   dedup.ModeTransactional,
		Key:    keyfuncs.Metadata("event_id"),
		Policy: dedup.Policy{Logger: watermill.NopLogger{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &outbox{db: db, kind: kind, table: tables[0], topic: topic, d: d, store: store,
		publisher: func(tx *sql.Tx) (message.Publisher, error) { return m.publisher(db, tx, kind) }}
}

// publishIn publishes the events in a transaction of their own, as a
// service writing its business rows and its outbox rows together would,
// and commits it unless rollback; wrap adjusts the outbox publisher.
func (o *outbox) publishIn(ctx context.Context, events []string, rollback bool, wrap func(message.Publisher) message.Publisher) error {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	inner, err := o.publisher(tx)
	if err != nil {
		return err
	}
	if wrap != nil {
		inner = wrap(inner)
	}
	pub, err := o.d.Decorate(inner)
	if err != nil {
		return err
	}
	txCtx := sqlstore.WithTx(ctx, tx)
	var msgs []*message.Message
	for _, e := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"event":%q}`, e)))
		m.Metadata.Set("event_id", e)
		m.SetContext(txCtx)
		msgs = append(msgs, m)
	}
	if err := pub.Publish(o.topic, msgs...); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback()
	}
	return tx.Commit()
}

// rows counts the outbox rows of each event.
func (o *outbox) rows(t *testing.T) map[string]int {
	t.Helper()
	rows, err := o.db.QueryContext(context.Background(), "SELECT metadata FROM "+o.table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var md []byte
		if err := rows.Scan(&md); err != nil {
			t.Fatal(err)
		}
		var m message.Metadata
		if err := jsonUnmarshal(md, &m); err != nil {
			t.Fatal(err)
		}
		out[m.Get("event_id")]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func forEachSQL(t *testing.T, fn func(t *testing.T, kind anystore.StoreKind)) {
	for _, kind := range []anystore.StoreKind{anystore.StorePostgres, anystore.StoreMySQL} {
		t.Run(string(kind), func(t *testing.T) { fn(t, kind) })
	}
}

// TestTransactionalOutbox: the record commits with the outbox row, so an
// event enters the outbox once, whatever the producer retries and
// whichever transaction rolls back. TestTransactionalOutboxV4 runs it on
// watermill-sql v4.
func TestTransactionalOutbox(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) { testTransactionalOutbox(t, newOutbox(t, kind)) })
}

func testTransactionalOutbox(t *testing.T, o *outbox) {
	ctx := context.Background()

	// A transaction rolled back after the publish (the service
	// failed later): neither the record nor the row stays.
	if err := o.publishIn(ctx, []string{"a"}, true, nil); err != nil {
		t.Fatal(err)
	}
	if n := o.rows(t)["a"]; n != 0 {
		t.Fatalf("a rolled-back transaction left %d outbox rows", n)
	}
	// The retry commits; a second retry and a batch repeating it
	// within the call add nothing for it.
	if err := o.publishIn(ctx, []string{"a"}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := o.publishIn(ctx, []string{"a", "b", "b", "c"}, false, nil); err != nil {
		t.Fatal(err)
	}
	// A new event repeated right after the call's first message: it
	// enters the outbox once.
	if err := o.publishIn(ctx, []string{"g", "g"}, false, nil); err != nil {
		t.Fatal(err)
	}
	// The outbox publisher fails in the middle of the transaction:
	// the records roll back to their savepoints, the transaction
	// stays usable, and the same transaction publishes again.
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := o.publisher(tx)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := o.d.Decorate(&flaky{Publisher: inner})
	if err != nil {
		t.Fatal(err)
	}
	m := func(e string) *message.Message {
		mm := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		mm.Metadata.Set("event_id", e)
		mm.SetContext(sqlstore.WithTx(ctx, tx))
		return mm
	}
	if err := pub.Publish(o.topic, m("d"), m("e")); !errors.Is(err, errBroker) {
		t.Fatalf("first publish in the transaction: %v, want the outbox's error", err)
	}
	if err := pub.Publish(o.topic, m("d"), m("e"), m("a")); err != nil {
		t.Fatalf("publish again in the same transaction: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "g": 1}
	if got := o.rows(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("outbox rows per event %v, want %v", got, want)
	}

	// Without a transaction in the context: refused, nothing written.
	free, err := o.publisher(nil)
	if err != nil {
		t.Fatal(err)
	}
	dp, _ := o.d.Decorate(free)
	mm := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	mm.Metadata.Set("event_id", "f")
	if err := dp.Publish(o.topic, mm); !errors.Is(err, publisher.ErrNoTransaction) {
		t.Fatalf("got %v, want ErrNoTransaction", err)
	}
	if n := o.rows(t)["f"]; n != 0 {
		t.Fatal("a message without a transaction was published")
	}
}

// TestTransactionalConcurrentProducers: producers in concurrent
// transactions publish the same events; the second waits for the first
// transaction on the record, and each event enters the outbox once.
func TestTransactionalConcurrentProducers(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		o := newOutbox(t, kind)
		const events = 20
		var wg sync.WaitGroup
		for p := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for e := range events {
					// Each producer rolls back one transaction in five, as
					// a service failing after its publish would.
					rollback := (e+p)%5 == 0
					evs := []string{fmt.Sprint(e), fmt.Sprint(e + 1)}
					for {
						err := o.publishIn(ctx, evs, rollback, nil)
						if err == nil {
							break
						}
						// A deadlock or lock wait between two producers'
						// transactions: roll back and try again, as a
						// service would.
						if ctx.Err() != nil || !errors.Is(err, dedup.ErrStore) {
							t.Errorf("producer %d, events %v: %v", p, evs, err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		got := o.rows(t)
		for e := range events + 1 {
			if n := got[fmt.Sprint(e)]; n != 1 {
				t.Errorf("event %d entered the outbox %d times, want 1", e, n)
			}
		}
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// key is the outbox's key function.
func (o *outbox) key() keyfuncs.KeyFunc { return keyfuncs.Metadata("event_id") }

// TestTwoTransactionsInOneCall: the messages of a transactional call
// must share one transaction, since the outbox publisher writes into one:
// a message whose record would commit with another transaction than its
// outbox row could be lost (its record done, its row rolled back).
func TestTwoTransactionsInOneCall(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) {
		ctx := context.Background()
		o := newOutbox(t, kind)
		tx1, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx1.Rollback()
		tx2, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		inner, err := wsql.NewPublisher(tx1, wsql.PublisherConfig{SchemaAdapter: o.schema}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := o.d.Decorate(inner)
		a := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		a.Metadata.Set("event_id", "a")
		a.SetContext(sqlstore.WithTx(ctx, tx1))
		b := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		b.Metadata.Set("event_id", "b")
		b.SetContext(sqlstore.WithTx(ctx, tx2))
		if err := pub.Publish(o.topic, a, b); !errors.Is(err, publisher.ErrNoTransaction) {
			t.Fatalf("got %v, want ErrNoTransaction for two transactions in one call", err)
		}
		_ = tx2.Commit()
		_ = tx1.Rollback()
		// Nothing was recorded: b publishes in a transaction of its own.
		if err := o.publishIn(ctx, []string{"b"}, false, nil); err != nil {
			t.Fatal(err)
		}
		if n := o.rows(t)["b"]; n != 1 {
			t.Fatalf("b has %d outbox rows, want 1", n)
		}
	})
}

func newMem(t *testing.T, clock stores.Clock) *memstore.Store { return testkit.Memstore(t, clock) }

func msg(uuid, payload string) *message.Message { return message.NewMessage(uuid, []byte(payload)) }

// panicky is a publisher whose Publish panics.
type panicky struct{ message.Publisher }

func (panicky) Publish(string, ...*message.Message) error { panic("broker client bug") }

// TestPanickingPublisherLeavesNoClaim: a panic in the decorated publisher
// releases the call's claims (and rolls back its records) before it goes
// on up, so a retry publishes.
func TestPanickingPublisherLeavesNoClaim(t *testing.T) {
	rec := &testkit.Recorder{}
	store := newMem(t, nil)
	d, err := publisher.New(publisher.Config{Store: store, Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := d.Decorate(panicky{})
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("the panic did not go on up")
			}
		}()
		_ = bad.Publish("t", msg("a", ""))
	}()
	good, _ := d.Decorate(rec)
	if err := good.Publish("t", msg("a", "")); err != nil {
		t.Fatalf("retry after a panic: %v", err)
	}
	if len(rec.UUIDs()) != 1 {
		t.Fatal("the retry did not publish")
	}

	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) {
		ctx := context.Background()
		o := newOutbox(t, kind)
		func() {
			defer func() { _ = recover() }()
			_ = o.publishIn(ctx, []string{"p"}, false, func(message.Publisher) message.Publisher { return panicky{} })
		}()
		// A caller that recovers and commits its transaction anyway must
		// not commit a record without its outbox row.
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		inner, _ := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: o.schema}, watermill.NopLogger{})
		pub, _ := o.d.Decorate(panicky{inner})
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set("event_id", "q")
		m.SetContext(sqlstore.WithTx(ctx, tx))
		func() {
			defer func() { _ = recover() }()
			_ = pub.Publish(o.topic, m)
		}()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := o.publishIn(ctx, []string{"q"}, false, nil); err != nil {
			t.Fatal(err)
		}
		if n := o.rows(t)["q"]; n != 1 {
			t.Fatalf("q has %d outbox rows after a recovered panic and a retry, want 1", n)
		}
	})
}

// TestTransactionalWaitIsTheCallersContext: a transactional publish of a
// key another open transaction has published waits for that transaction
// to end, however long, bounded by the message's context and not by
// StoreTimeout (whose cancellation would kill the caller's connection).
func TestTransactionalWaitIsTheCallersContext(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind anystore.StoreKind) {
		ctx := context.Background()
		o := newOutbox(t, kind)
		store := o.store
		d, err := publisher.New(publisher.Config{Store: store, Mode: dedup.ModeTransactional, Key: o.key(), Policy: dedup.Policy{StoreTimeout: 200 * time.Millisecond, Logger: watermill.NopLogger{}}})
		if err != nil {
			t.Fatal(err)
		}
		o.d = d
		txA, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer txA.Rollback() // a failing test must not leave the cleanup's DROP waiting
		innerA, _ := wsql.NewPublisher(txA, wsql.PublisherConfig{SchemaAdapter: o.schema}, watermill.NopLogger{})
		pubA, _ := d.Decorate(innerA)
		ma := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		ma.Metadata.Set("event_id", "w")
		ma.SetContext(sqlstore.WithTx(ctx, txA))
		if err := pubA.Publish(o.topic, ma); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- o.publishIn(ctx, []string{"w"}, false, nil) }()
		// B waits on A's record; A ends well after B's StoreTimeout.
		select {
		case err := <-done:
			t.Fatalf("B returned before A ended: %v", err)
		case <-time.After(600 * time.Millisecond):
		}
		if err := txA.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("B after A rolled back: %v", err)
		}
		if n := o.rows(t)["w"]; n != 1 {
			t.Fatalf("w has %d outbox rows, want 1 (B's)", n)
		}
	})
}
