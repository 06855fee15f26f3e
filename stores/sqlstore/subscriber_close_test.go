package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql3std "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4std "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
	"github.com/watermill-dedup/dedup/stores/storetest"
	"github.com/watermill-dedup/dedup/testkit"
)

// The tests below run the transactional inbox joined to a watermill-sql
// subscriber's transaction (Config.JoinTx) through the lifecycle events
// where watermill-sql ends a delivery without the router's ack: the
// router's Close while a handler runs, and the subscriber's AckDeadline
// passing under a running handler. watermill-sql commits its
// transaction then (it commits whenever a delivery ends without an
// error of its own), with whatever the handler and the inbox had written
// in it so far. Each scenario ends with a second router on the same
// consumer group and checks the one effect the event must have.

// TestJoinedTxSurvivesGracefulClose: router.Close() while the handler of
// the only message runs.
//
//   - stops on cancellation: the handler returns when its context ends.
//     watermill-sql cancels the message's context as it gives the
//     delivery up and commits: the record Begin wrote without the
//     handler's write, and the redelivery was acked as a duplicate (no
//     effect at all).
//   - returns on cancellation: the same without waiting for the
//     subscriber's commit, which raced the inbox's rollback to its
//     savepoint.
//   - finishes: the handler completes its write after Close began. The
//     router cancels the subscription's context as it closes, and
//     watermill-sql rolls back what a subscription ended by its context
//     had acked, unless the subscriber's Close came first: the effect is
//     then either committed with the ack or rolled back with it, and
//     run again by the second router.
func TestJoinedTxSurvivesGracefulClose(t *testing.T) {
	forEachJoinedPubSub(t, func(t *testing.T, b backend, w wsqlMajor) {
		t.Run("returns on cancellation", func(t *testing.T) {
			runJoinedLifecycle(t, b, w, joinedLifecycle{
				ackDeadline: time.Minute,
				first: func(ctx context.Context, tx *sql.Tx, write func(int) error) error {
					<-ctx.Done()
					return ctx.Err()
				},
				closeRouter: true,
			})
		})
		t.Run("stops on cancellation", func(t *testing.T) {
			runJoinedLifecycle(t, b, w, joinedLifecycle{
				ackDeadline: 2 * time.Second,
				first: func(ctx context.Context, tx *sql.Tx, write func(int) error) error {
					<-ctx.Done()
					waitTxEnded(t, tx)
					return ctx.Err()
				},
				closeRouter: true,
			})
		})
		t.Run("finishes", func(t *testing.T) {
			release := make(chan struct{})
			l := joinedLifecycle{
				ackDeadline: time.Minute,
				first: func(ctx context.Context, tx *sql.Tx, write func(int) error) error {
					<-release
					return write(5)
				},
				closeRouter: true,
				onClose:     func() { close(release) },
			}
			runJoinedLifecycle(t, b, w, l)
		})
	})
}

// TestJoinedTxSurvivesAckDeadline: the subscriber's AckDeadline passes
// while the handler runs. The handler writes half of its effect, waits
// for its context to end (the subscriber giving the delivery up), then
// writes the other half and succeeds. watermill-sql committed at the
// deadline: the record with half the effect.
func TestJoinedTxSurvivesAckDeadline(t *testing.T) {
	forEachJoinedPubSub(t, func(t *testing.T, b backend, w wsqlMajor) {
		runJoinedLifecycle(t, b, w, joinedLifecycle{
			ackDeadline: 1500 * time.Millisecond,
			first: func(ctx context.Context, tx *sql.Tx, write func(int) error) error {
				if err := write(2); err != nil {
					return err
				}
				<-ctx.Done()
				waitTxEnded(t, tx)
				// A handler that does not watch its context: it writes
				// the rest and reports success.
				_ = write(3)
				return nil
			},
		})
	})
}

func forEachJoinedPubSub(t *testing.T, fn func(t *testing.T, b backend, w wsqlMajor)) {
	for _, w := range []struct {
		name string
		w    wsqlMajor
	}{{"v3", wsqlV3}, {"v4", wsqlV4}} {
		t.Run(w.name, func(t *testing.T) {
			forEachBackend(t, serverBackends, func(t *testing.T, b backend) { fn(t, b, w.w) })
		})
	}
}

// joinedLifecycle is one scenario of runJoinedLifecycle.
type joinedLifecycle struct {
	ackDeadline time.Duration
	// first is the first run of the handler; write adds to the ledger in
	// the inbox transaction, whether the handler's context ended or not. Later runs write the event's whole amount
	// (5) at once.
	first func(ctx context.Context, tx *sql.Tx, write func(amount int) error) error
	// closeRouter closes the first router once its handler runs;
	// onClose, if set, is called once the router closes the subscriber.
	closeRouter bool
	onClose     func()
}

// closeSpy reports when the router closes its subscriber.
type closeSpy struct {
	message.Subscriber
	once   sync.Once
	closed chan struct{}
}

func (s *closeSpy) Close() error {
	s.once.Do(func() { close(s.closed) })
	return s.Subscriber.Close()
}

func runJoinedLifecycle(t *testing.T, b backend, w wsqlMajor, sc joinedLifecycle) {
	db := b.open(t)
	s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: w.joinTx})
	l := newLedger(t, db, b.dialect, 1)
	topic := "dedup_" + storetest.NewID()
	t.Cleanup(func() {
		dropTable(t, db, b.dialect, "watermill_"+topic)
		dropTable(t, db, b.dialect, "watermill_offsets_"+topic)
	})
	pub, sub1 := w.pubSub(t, db, b.dialect, sc.ackDeadline)
	defer pub.Close()
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set("event_id", "1")
	if err := pub.Publish(topic, m); err != nil {
		t.Fatal(err)
	}

	var runs, acked atomic.Int64
	started := make(chan struct{})
	handler := func(msg *message.Message) error {
		tx, ok := sqlstore.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no inbox transaction in the handler's context")
		}
		// The handler's writes do not watch its context: the scenarios
		// decide themselves when a handler stops.
		write := func(amount int) error { return l.add(context.WithoutCancel(msg.Context()), tx, 0, amount) }
		if runs.Add(1) == 1 {
			close(started)
			return sc.first(msg.Context(), tx, write)
		}
		return write(5)
	}
	newRouter := func(sub message.Subscriber) (*message.Router, chan error) {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 2 * time.Minute}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := middleware.New(middleware.Config{
			Store:  s,
			Mode:   dedup.ModeTransactional,
			Scope:  "lifecycle-" + topic,
			Key:    keyfuncs.Metadata("event_id"),
			Policy: dedup.Policy{Retention: time.Hour},
		})
		if err != nil {
			t.Fatal(err)
		}
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err == nil {
					acked.Add(1)
				}
				return out, err
			}
		}, mw.Middleware)
		r.AddConsumerHandler("lifecycle", topic, sub, func(msg *message.Message) error { return handler(msg) })
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		<-r.Running()
		return r, done
	}

	spy := &closeSpy{Subscriber: sub1, closed: make(chan struct{})}
	r1, done1 := newRouter(spy)
	<-started
	if sc.closeRouter {
		closed := make(chan error, 1)
		go func() { closed <- r1.Close() }()
		<-spy.closed
		if sc.onClose != nil {
			sc.onClose()
		}
		if err := <-closed; err != nil {
			t.Fatalf("first router's Close: %v", err)
		}
	} else {
		testkit.WaitFor(t, 2*time.Minute, "the first run to end", func() bool { return acked.Load() > 0 || runs.Load() > 1 })
		r1.Close()
	}
	<-done1

	_, sub2 := w.pubSub(t, db, b.dialect, time.Minute)
	r2, done2 := newRouter(sub2)
	defer func() {
		_ = r2.Close()
		<-done2
	}()
	testkit.WaitFor(t, time.Minute, "the event's one effect", func() bool { return l.sum(t, db) >= 5 })
	if got := l.sum(t, db); got != 5 {
		t.Errorf("ledger = %d, want 5", got)
	}
	t.Logf("%d runs, %d acked", runs.Load(), acked.Load())
}

// waitTxEnded returns once tx is committed or rolled back.
func waitTxEnded(t *testing.T, tx *sql.Tx) {
	for {
		if _, err := tx.ExecContext(context.Background(), "SELECT 1"); errors.Is(err, sql.ErrTxDone) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestJoinTxRefusesUnguardedSubscriber: the transaction of a
// watermill-sql subscriber built by watermill-sql itself, whose commit is
// not tied to the router's ack, is refused by the finders (ErrNotGuarded,
// and Begin's ErrTxNotJoinable), and nothing is written in it.
func TestJoinTxRefusesUnguardedSubscriber(t *testing.T) {
	db := openPostgres(t)
	schema, offsets := wsql4Adapters(sqlstore.Postgres)
	for _, c := range []struct {
		name    string
		find    sqlstore.TxFinder
		pubSub  func(t *testing.T) (message.Publisher, message.Subscriber)
		refusal error
	}{
		{"v3", wsql3.SubscriberTx, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return wsql3PlainPubSub(t, db)
		}, wsql3.ErrNotGuarded},
		{"v4", wsql4.SubscriberTx, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return wsql4PlainPubSub(t, wsql4std.BeginnerFromStdSQL(db), schema, offsets)
		}, wsql4.ErrNotGuarded},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, db, sqlstore.Postgres, sqlstore.Config{JoinTx: c.find})
			topic := "dedup_" + storetest.NewID()
			t.Cleanup(func() {
				dropTable(t, db, sqlstore.Postgres, "watermill_"+topic)
				dropTable(t, db, sqlstore.Postgres, "watermill_offsets_"+topic)
			})
			pub, sub := c.pubSub(t)
			defer pub.Close()
			if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			msg := <-msgs
			_, err = s.Begin(msg.Context(), "scope", []string{"k"}, time.Hour)
			if !errors.Is(err, c.refusal) || !errors.Is(err, sqlstore.ErrTxNotJoinable) {
				t.Fatalf("Begin in an unguarded subscriber's transaction = %v, want %v and ErrTxNotJoinable", err, c.refusal)
			}
			msg.Nack()
			if n := countRows(t, db, sqlstore.Postgres, s.Table()); n != 0 {
				t.Fatalf("%d records written by a refused Begin", n)
			}
		})
	}
}

// wsql3PlainPubSub is a v3 publisher and a subscriber as watermill-sql
// builds them, on db, without the guard wsql3.NewSubscriber adds.
func wsql3PlainPubSub(t *testing.T, db *sql.DB) (message.Publisher, message.Subscriber) {
	logger := watermill.NopLogger{}
	schema := wsql3std.DefaultPostgreSQLSchema{}
	pub, err := wsql3std.NewPublisher(db, wsql3std.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql3std.NewSubscriber(db, wsql3std.SubscriberConfig{
		ConsumerGroup:    "dedup-test",
		SchemaAdapter:    schema,
		OffsetsAdapter:   wsql3std.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return pub, sub
}

// TestGuardedSubscriberCloseCommitsAcked: Close waits for the delivery in
// flight, then the watermill-sql subscriber commits what was acked in its
// transaction (the two first messages of a batch of three, with their
// records and effects), and nothing of the third, which the next
// subscriber of the group gets.
func TestGuardedSubscriberCloseCommitsAcked(t *testing.T) {
	forEachJoinedPubSub(t, func(t *testing.T, b backend, w wsqlMajor) {
		db := b.open(t)
		s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: w.joinTx})
		l := newLedger(t, db, b.dialect, 1)
		topic := "dedup_" + storetest.NewID()
		t.Cleanup(func() {
			dropTable(t, db, b.dialect, "watermill_"+topic)
			dropTable(t, db, b.dialect, "watermill_offsets_"+topic)
		})
		pub, sub := w.pubSub(t, db, b.dialect, time.Minute)
		defer pub.Close()
		for i := 1; i <= 3; i++ {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("event_id", strconv.Itoa(i))
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// handle runs one event's inbox transaction up to its commit.
		handle := func(msgs <-chan *message.Message) (*message.Message, func()) {
			msg := <-msgs
			itx, err := s.Begin(msg.Context(), "close", []string{msg.Metadata.Get("event_id")}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			hctx := itx.Context(msg.Context())
			tx, _ := sqlstore.TxFromContext(hctx)
			ev, _ := strconv.Atoi(msg.Metadata.Get("event_id"))
			if err := l.add(hctx, tx, 0, ev); err != nil {
				t.Fatal(err)
			}
			return msg, func() {
				if err := itx.Commit(hctx, nil); err != nil {
					t.Fatal(err)
				}
				msg.Ack()
			}
		}
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		_, finish := handle(msgs)
		finish()
		second, finish := handle(msgs)
		closed := make(chan error, 1)
		go func() { closed <- sub.Close() }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) with message %s in flight", err, second.Metadata.Get("event_id"))
		case <-time.After(300 * time.Millisecond):
		}
		finish()
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if got := l.sum(t, db); got != 1+2 {
			t.Fatalf("ledger after Close = %d, want 3 (events 1 and 2, acked before Close returned)", got)
		}
		if n := countRows(t, db, b.dialect, s.Table()); n != 2 {
			t.Fatalf("%d records after Close, want 2", n)
		}

		_, next := w.pubSub(t, db, b.dialect, time.Minute)
		defer next.Close()
		msgs, err = next.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		third, finish := handle(msgs)
		if id := third.Metadata.Get("event_id"); id != "3" {
			t.Fatalf("the next subscriber got event %s first, want 3", id)
		}
		finish()
		testkit.WaitFor(t, time.Minute, "event 3 committed", func() bool { return l.sum(t, db) == 6 })
	})
}
