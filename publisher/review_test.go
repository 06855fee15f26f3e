package publisher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestTwoTransactionsInOneCall: the messages of a transactional call
// must share one transaction, since the outbox publisher writes into one:
// a message whose record would commit with another transaction than its
// outbox row could be lost (its record done, its row rolled back).
func TestTwoTransactionsInOneCall(t *testing.T) {
	forEachSQL(t, func(t *testing.T, kind testkit.StoreKind) {
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

// panicky is a publisher whose Publish panics.
type panicky struct{ message.Publisher }

func (panicky) Publish(string, ...*message.Message) error { panic("broker client bug") }

// TestPanickingPublisherLeavesNoClaim: a panic in the decorated publisher
// releases the call's claims (and rolls back its records) before it goes
// on up, so a retry publishes.
func TestPanickingPublisherLeavesNoClaim(t *testing.T) {
	rec := &recorder{}
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
	if len(rec.uuids()) != 1 {
		t.Fatal("the retry did not publish")
	}

	forEachSQL(t, func(t *testing.T, kind testkit.StoreKind) {
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
	forEachSQL(t, func(t *testing.T, kind testkit.StoreKind) {
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

// TestCancelledWhileWaiting: a message whose context ends while it waits
// for another producer fails with the context's error.
func TestCancelledWhileWaiting(t *testing.T) {
	store := newMem(t, nil)
	c, err := store.Claim(context.Background(), "publish:t", []string{"a"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatal(c, err)
	}
	pub := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{InProgressWait: time.Minute, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}}, &recorder{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	m := msg("a", "")
	m.SetContext(ctx)
	if err := pub.Publish("t", m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}
}
