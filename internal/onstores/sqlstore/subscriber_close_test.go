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
	wsql4std "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
	"github.com/watermill-dedup/dedup/stores/storetest"
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
	forEachJoinedPubSub(t, func(t *testing.T, b sqltest.Backend, w wsqlMajor) {
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
	forEachJoinedPubSub(t, func(t *testing.T, b sqltest.Backend, w wsqlMajor) {
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

func forEachJoinedPubSub(t *testing.T, fn func(t *testing.T, b sqltest.Backend, w wsqlMajor)) {
	forEachWsqlMajor(t, func(t *testing.T, w wsqlMajor) {
		sqltest.ForEachBackend(t, serverBackends, func(t *testing.T, b sqltest.Backend) { fn(t, b, w) })
	})
}

// forEachWsqlMajor runs fn with each watermill-sql major, as subtests v3
// and v4.
func forEachWsqlMajor(t *testing.T, fn func(t *testing.T, w wsqlMajor)) {
	for _, w := range []struct {
		name string
		w    wsqlMajor
	}{{"v3", wsqlV3}, {"v4", wsqlV4}} {
		t.Run(w.name, func(t *testing.T) { fn(t, w.w) })
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

func runJoinedLifecycle(t *testing.T, b sqltest.Backend, w wsqlMajor, sc joinedLifecycle) {
	rig := newJoinedRig(t, b, w)
	db, s, l, topic := rig.db, rig.s, rig.l, rig.topic
	pub, sub1 := w.pubSub(t, db, b.Dialect, sc.ackDeadline)
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
		write := func(amount int) error { return l.Add(context.WithoutCancel(msg.Context()), tx, 0, amount) }
		if runs.Add(1) == 1 {
			close(started)
			return sc.first(msg.Context(), tx, write)
		}
		return write(5)
	}
	newRouter := func(sub message.Subscriber) (*message.Router, chan error) {
		r, mw := txRouter(t, s, "lifecycle-"+topic, 2*time.Minute)
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err == nil {
					acked.Add(1)
				}
				return out, err
			}
		}, mw)
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

	_, sub2 := w.pubSub(t, db, b.Dialect, time.Minute)
	r2, done2 := newRouter(sub2)
	defer func() {
		_ = r2.Close()
		<-done2
	}()
	testkit.WaitFor(t, time.Minute, "the event's one effect", func() bool { return l.Sum(t, db) >= 5 })
	if got := l.Sum(t, db); got != 5 {
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
	db := sqltest.OpenPostgres(t)
	for _, c := range []struct {
		name    string
		find    sqlstore.TxFinder
		pubSub  func(t *testing.T) (message.Publisher, message.Subscriber)
		refusal error
	}{
		{"v3", wsql3.SubscriberTx, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return wsql3PubSub(t, db, sqlstore.Postgres, 0, nil)
		}, wsql3.ErrNotGuarded},
		{"v4", wsql4.SubscriberTx, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return wsql4PlainPubSub(t, wsql4std.BeginnerFromStdSQL(db))
		}, wsql4.ErrNotGuarded},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{JoinTx: c.find})
			topic := newWsqlTopic(t, db, sqlstore.Postgres)
			pub, sub := c.pubSub(t)
			defer pub.Close()
			msg := deliverOne(t, pub, sub, topic, nil)
			_, err := s.Begin(msg.Context(), "scope", []string{"k"}, time.Hour)
			if !errors.Is(err, c.refusal) || !errors.Is(err, sqlstore.ErrTxNotJoinable) {
				t.Fatalf("Begin in an unguarded subscriber's transaction = %v, want %v and ErrTxNotJoinable", err, c.refusal)
			}
			msg.Nack()
			if n := sqltest.CountRows(t, db, sqlstore.Postgres, s.Table()); n != 0 {
				t.Fatalf("%d records written by a refused Begin", n)
			}
		})
	}
}

// TestGuardedSubscriberCloseCommitsAcked: Close waits for the delivery in
// flight, then the watermill-sql subscriber commits what was acked in its
// transaction (the two first messages of a batch of three, with their
// records and effects), and nothing of the third, which the next
// subscriber of the group gets.
func TestGuardedSubscriberCloseCommitsAcked(t *testing.T) {
	forEachJoinedPubSub(t, func(t *testing.T, b sqltest.Backend, w wsqlMajor) {
		r := newJoinedRig(t, b, w)
		db, s, l, topic := r.db, r.s, r.l, r.topic
		pub, sub := w.pubSub(t, db, b.Dialect, time.Minute)
		defer pub.Close()
		for i := 1; i <= 3; i++ {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("event_id", strconv.Itoa(i))
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		}
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
			if err := l.Add(hctx, tx, 0, ev); err != nil {
				t.Fatal(err)
			}
			return msg, func() {
				if err := itx.Commit(hctx, nil); err != nil {
					t.Fatal(err)
				}
				msg.Ack()
			}
		}
		msgs := subscribe(t, sub, topic)
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
		if got := l.Sum(t, db); got != 1+2 {
			t.Fatalf("ledger after Close = %d, want 3 (events 1 and 2, acked before Close returned)", got)
		}
		if n := sqltest.CountRows(t, db, b.Dialect, s.Table()); n != 2 {
			t.Fatalf("%d records after Close, want 2", n)
		}

		_, next := w.pubSub(t, db, b.Dialect, time.Minute)
		defer next.Close()
		msgs = subscribe(t, next, topic)
		third, finish := handle(msgs)
		if id := third.Metadata.Get("event_id"); id != "3" {
			t.Fatalf("the next subscriber got event %s first, want 3", id)
		}
		finish()
		testkit.WaitFor(t, time.Minute, "event 3 committed", func() bool { return l.Sum(t, db) == 6 })
	})
}

// joinedRig is a store joining a guarded watermill-sql subscriber's
// transaction, a ledger, and a topic, for the tests below that handle
// messages by hand (no router), one step at a time.
type joinedRig struct {
	t     *testing.T
	b     sqltest.Backend
	db    *sql.DB
	s     *sqlstore.Store
	l     *sqltest.Ledger
	topic string
	scope string
}

func newJoinedRig(t *testing.T, b sqltest.Backend, w wsqlMajor) *joinedRig {
	db := b.Open(t)
	r := &joinedRig{t: t, b: b, db: db, s: sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{JoinTx: w.joinTx}),
		l: sqltest.NewLedger(t, db, b.Dialect, 1), topic: newWsqlTopic(t, db, b.Dialect)}
	r.scope = "rig-" + r.topic
	return r
}

// publish publishes events from..to, each its number as its amount.
func (r *joinedRig) publish(pub message.Publisher, from, to int) {
	for i := from; i <= to; i++ {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set("event_id", strconv.Itoa(i))
		if err := pub.Publish(r.topic, m); err != nil {
			r.t.Fatal(err)
		}
	}
}

// begin reads the next message of msgs and begins its inbox transaction.
func (r *joinedRig) begin(msgs <-chan *message.Message) (*message.Message, stores.InboxTx, *sql.Tx) {
	r.t.Helper()
	var msg *message.Message
	select {
	case msg = <-msgs:
	case <-time.After(time.Minute):
		r.t.Fatal("no message delivered within a minute")
	}
	itx, err := r.s.Begin(msg.Context(), r.scope, []string{msg.Metadata.Get("event_id")}, time.Hour)
	if err != nil {
		r.t.Fatalf("Begin of event %s: %v", msg.Metadata.Get("event_id"), err)
	}
	tx, _ := sqlstore.TxFromContext(itx.Context(msg.Context()))
	return msg, itx, tx
}

// handle applies the next message of msgs (or finds it a duplicate) and
// acks it; it returns its event.
func (r *joinedRig) handle(msgs <-chan *message.Message) int {
	r.t.Helper()
	msg, itx, tx := r.begin(msgs)
	ev, _ := strconv.Atoi(msg.Metadata.Get("event_id"))
	if itx.Result() == stores.Claimed {
		if err := r.l.Add(msg.Context(), tx, 0, ev); err != nil {
			r.t.Fatal(err)
		}
		if err := itx.Commit(msg.Context(), nil); err != nil {
			r.t.Fatal(err)
		}
	}
	msg.Ack()
	return ev
}

// drain handles every message a new subscriber of the group gets until
// the ledger holds want, and fails if it never does or holds more.
func (r *joinedRig) drain(w wsqlMajor, want int64) {
	r.t.Helper()
	_, sub := w.pubSub(r.t, r.db, r.b.Dialect, time.Minute)
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case msg := <-msgs:
				if msg == nil {
					return
				}
				itx, err := r.s.Begin(msg.Context(), r.scope, []string{msg.Metadata.Get("event_id")}, time.Hour)
				if err != nil {
					msg.Nack()
					continue
				}
				if itx.Result() == stores.Claimed {
					ev, _ := strconv.Atoi(msg.Metadata.Get("event_id"))
					tx, _ := sqlstore.TxFromContext(itx.Context(msg.Context()))
					if err := r.l.Add(msg.Context(), tx, 0, ev); err != nil {
						_ = itx.Rollback(msg.Context())
						msg.Nack()
						continue
					}
					if err := itx.Commit(msg.Context(), nil); err != nil {
						msg.Nack()
						continue
					}
				}
				msg.Ack()
			}
		}
	}()
	testkit.WaitFor(r.t, time.Minute, "every event's effect", func() bool { return r.l.Sum(r.t, r.db) >= want })
	cancel()
	<-done
	if got := r.l.Sum(r.t, r.db); got != want {
		r.t.Fatalf("ledger = %d, want %d", got, want)
	}
}

// deadlock makes tx the victim of an InnoDB deadlock: the server rolls the
// whole transaction back and the client's *sql.Tx stays open. It returns
// the victim's error.
func (r *joinedRig) deadlock(tx *sql.Tx) error {
	r.t.Helper()
	ctx := context.Background()
	locks, heavy := "locks_"+storetest.NewID(), "heavy_"+storetest.NewID()
	for _, q := range []string{
		"CREATE TABLE " + locks + " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL) ENGINE=InnoDB",
		"INSERT INTO " + locks + " VALUES (1, 0), (2, 0)",
		"CREATE TABLE " + heavy + " (id INTEGER PRIMARY KEY AUTO_INCREMENT, v INTEGER) ENGINE=InnoDB",
	} {
		if _, err := r.db.ExecContext(ctx, q); err != nil {
			r.t.Fatal(err)
		}
	}
	r.t.Cleanup(func() {
		sqltest.DropTable(r.t, r.db, r.b.Dialect, locks)
		sqltest.DropTable(r.t, r.db, r.b.Dialect, heavy)
	})
	if _, err := tx.ExecContext(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 1"); err != nil {
		r.t.Fatal(err)
	}
	// The other transaction writes more rows: InnoDB rolls back the
	// lighter one, tx.
	other, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	defer other.Rollback()
	for range 20 {
		if _, err := other.ExecContext(ctx, "INSERT INTO "+heavy+" (v) VALUES (1), (2), (3), (4), (5), (6), (7), (8), (9), (10)"); err != nil {
			r.t.Fatal(err)
		}
	}
	if _, err := other.ExecContext(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 2"); err != nil {
		r.t.Fatal(err)
	}
	otherDone := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 1")
		otherDone <- err
	}()
	_, err = tx.ExecContext(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 2")
	if err == nil {
		r.t.Fatalf("the joined transaction was not the deadlock's victim (the other: %v)", <-otherDone)
	}
	if oerr := <-otherDone; oerr != nil {
		r.t.Fatalf("the other transaction failed too: %v", oerr)
	}
	return err
}

// mysqlJoined runs fn on MySQL, where a deadlock leaves the transaction
// open on the client, with each watermill-sql major.
func mysqlJoined(t *testing.T, fn func(t *testing.T, b sqltest.Backend, w wsqlMajor)) {
	forEachWsqlMajor(t, func(t *testing.T, w wsqlMajor) { fn(t, backends[1], w) })
}

// TestJoinedTxDeadlockThenClose: in a batch of five, events 1 and 2 are
// applied and acked; event 3's handler is a deadlock's victim, and the
// server rolls the whole subscriber transaction back, events 1 and 2
// with it, while the client's *sql.Tx stays open. The store nacks event 3
// (ErrTxAborted) and the subscriber is closed. Its offset ack ran in
// autocommit and committed the offsets of events 1 and 2, which were then
// never applied.
func TestJoinedTxDeadlockThenClose(t *testing.T) {
	mysqlJoined(t, func(t *testing.T, b sqltest.Backend, w wsqlMajor) {
		r := newJoinedRig(t, b, w)
		pub, sub := w.pubSub(t, r.db, b.Dialect, time.Minute)
		defer pub.Close()
		r.publish(pub, 1, 5)
		msgs := subscribe(t, sub, r.topic)
		r.handle(msgs)
		r.handle(msgs)
		msg, itx, tx := r.begin(msgs)
		derr := r.deadlock(tx)
		if err := itx.Rollback(msg.Context()); !errors.Is(err, stores.ErrTxAborted) {
			t.Fatalf("Rollback after the deadlock (%v) = %v, want ErrTxAborted", derr, err)
		}
		msg.Nack()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		r.drain(w, 1+2+3+4+5)
	})
}

// TestJoinedTxDeadlockThenAckDeadline: as TestJoinedTxDeadlockThenClose,
// in a batch of three, without Close, and without the store seeing the
// deadlock: event 3's delivery outlives the AckDeadline. The guard rolled
// the transaction back by cancelling its context only, and watermill-sql's
// offset ack, the batch's last statement, often ran before database/sql
// had marked the transaction done: in autocommit.
func TestJoinedTxDeadlockThenAckDeadline(t *testing.T) {
	mysqlJoined(t, func(t *testing.T, b sqltest.Backend, w wsqlMajor) {
		for round := range 3 {
			r := newJoinedRig(t, b, w)
			pub, sub := w.pubSub(t, r.db, b.Dialect, time.Second, wsqlBatch(3))
			r.publish(pub, 1, 3)
			ctx, cancel := context.WithCancel(context.Background())
			msgs, err := sub.Subscribe(ctx, r.topic)
			if err != nil {
				t.Fatal(err)
			}
			r.handle(msgs)
			r.handle(msgs)
			msg, _, tx := r.begin(msgs)
			_ = r.deadlock(tx)
			<-msg.Context().Done() // the guard gave the delivery up at its deadline
			cancel()
			_ = sub.Close()
			_ = pub.Close()
			r.drain(w, 1+2+3)
			t.Logf("round %d: every event applied once", round)
		}
	})
}

// TestQueueAdapterCloseAcksOnlyDelivered: watermill-sql v4's queue
// adapters ack every row of a batch, also of one cut short: Close in the
// middle of a batch of five acked the three rows never delivered, and
// they were lost.
func TestQueueAdapterCloseAcksOnlyDelivered(t *testing.T) {
	sqltest.ForEachBackend(t, serverBackends, func(t *testing.T, b sqltest.Backend) {
		r := newJoinedRig(t, b, wsqlV4)
		pub, sub := wsqlV4.pubSub(t, r.db, b.Dialect, time.Minute, wsqlBatch(5), wsqlQueue())
		defer pub.Close()
		r.publish(pub, 1, 5)
		msgs := subscribe(t, sub, r.topic)
		r.handle(msgs)
		r.handle(msgs)
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		if got := r.l.Sum(t, r.db); got != 1+2 {
			t.Fatalf("ledger after Close = %d, want 3", got)
		}
		_, next := wsqlV4.pubSub(t, r.db, b.Dialect, time.Minute, wsqlQueue())
		defer next.Close()
		msgs = subscribe(t, next, r.topic)
		for want := 3; want <= 5; want++ {
			if ev := r.handle(msgs); ev != want {
				t.Fatalf("the next subscriber got event %d, want %d", ev, want)
			}
		}
	})
}

// TestGuardedSubscriberSecondCloseWaits: a second Close (a router closes
// a subscriber once per handler that shares it) returned at once while
// the first still waited for the delivery in flight.
func TestGuardedSubscriberSecondCloseWaits(t *testing.T) {
	r := newJoinedRig(t, backends[0], wsqlV3)
	pub, sub := wsqlV3.pubSub(t, r.db, r.b.Dialect, time.Minute)
	defer pub.Close()
	r.publish(pub, 1, 1)
	msgs := subscribe(t, sub, r.topic)
	msg, itx, tx := r.begin(msgs)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- sub.Close() }()
	go func() { second <- sub.Close() }()
	select {
	case err := <-second:
		t.Fatalf("a second Close returned (%v) with the delivery in flight", err)
	case err := <-first:
		t.Fatalf("Close returned (%v) with the delivery in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := r.l.Add(msg.Context(), tx, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := itx.Commit(msg.Context(), nil); err != nil {
		t.Fatal(err)
	}
	msg.Ack()
	if err := errors.Join(<-first, <-second); err != nil {
		t.Fatal(err)
	}
	if got := r.l.Sum(t, r.db); got != 1 {
		t.Fatalf("ledger after Close = %d, want 1", got)
	}
}

// TestGuardedSubscriberDeadlineSpansResends: a message nacked at every
// delivery is resent in the same transaction; its AckDeadline runs from
// its first delivery, as watermill-sql's own, so its transaction is
// rolled back and begun again. The guard knew a resend by the message's
// uuid: one without a uuid got a new deadline at every resend, and its
// transaction never ended.
func TestGuardedSubscriberDeadlineSpansResends(t *testing.T) {
	r := newJoinedRig(t, backends[0], wsqlV3)
	pub, sub := wsqlV3.pubSub(t, r.db, r.b.Dialect, 500*time.Millisecond)
	defer pub.Close()
	m := message.NewMessage("", nil)
	m.Metadata.Set("event_id", "1")
	if err := pub.Publish(r.topic, m); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs := subscribe(t, sub, r.topic)
	txs := map[*sql.Tx]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(txs) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute of nacks the message was delivered in %d transaction(s), want a second one after its AckDeadline", len(txs))
		}
		msg := <-msgs
		tx, err := wsql3.SubscriberTx(msg.Context())
		if err != nil {
			t.Fatal(err)
		}
		txs[tx] = true
		msg.Nack()
	}
}
