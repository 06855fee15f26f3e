package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// txRouter returns a router that waits closeTimeout for its handlers as
// it closes, and the transactional dedup middleware on s in scope, keyed
// by the event_id metadata, with a retention of an hour.
func txRouter(t *testing.T, s *sqlstore.Store, scope string, closeTimeout time.Duration) (*message.Router, message.HandlerMiddleware) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: closeTimeout}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := middleware.New(middleware.Config{
		Store:  s,
		Mode:   dedup.ModeTransactional,
		Scope:  scope,
		Key:    keyfuncs.Metadata("event_id"),
		Policy: dedup.Policy{Retention: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	return router, mw.Middleware
}

// TestInboxLedger is the transactional acceptance test: 2,000 events,
// each delivered 1-3 times, 64 concurrent workers, 5% of first attempts
// failing after their business write. The ledger sum must be exact and
// the inbox must hold one row per event.
func TestInboxLedger(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db, s, l := sqltest.LedgerStore(t, b, 16)
		events, st := sqltest.RunLedger(t, db, b.Dialect, s, l)
		if st.Failures.Load() != int64(events/20) {
			t.Errorf("%d injected failures, want %d", st.Failures.Load(), events/20)
		}
		t.Logf("%s: %d duplicates, %d failed first attempts, %d store errors (retried)", b.Dialect, st.Duplicates.Load(), st.Failures.Load(), st.StoreErrors.Load())
	})
}

// TestInboxCrashAfterCommit: the transaction commits, then the consumer
// dies before acking; the broker redelivers. The redelivery is a Duplicate
// with the committed data and has no second effect.
func TestInboxCrashAfterCommit(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db, s, l := sqltest.LedgerStore(t, b, 1)
		ctx := context.Background()
		e := sqltest.Event{ID: 7, Amount: 42}
		st := &sqltest.Stats{}
		if err := sqltest.Process(ctx, s, l, "crash", e, nil, st); err != nil {
			t.Fatal(err)
		}
		// crash: no ack. Redelivered twice.
		for range 2 {
			if err := sqltest.Process(ctx, s, l, "crash", e, nil, st); err != nil {
				t.Fatal(err)
			}
		}
		if st.Committed.Load() != 1 || st.Duplicates.Load() != 2 {
			t.Fatalf("committed %d, duplicates %d; want 1 and 2", st.Committed.Load(), st.Duplicates.Load())
		}
		if got := l.Sum(t, db); got != 42 {
			t.Fatalf("ledger = %d, want 42", got)
		}
	})
}

// TestInboxConcurrentDuplicateWaits: a second Begin of a key whose first
// transaction is open waits on the primary key, then reports Duplicate
// when the first commits, or claims the key when it rolls back.
func TestInboxConcurrentDuplicateWaits(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{})
		ctx := context.Background()
		for _, commit := range []bool{true, false} {
			key := fmt.Sprintf("k-%v", commit)
			first, err := s.Begin(ctx, "wait", []string{key}, time.Hour)
			if err != nil || first.Result() != stores.Claimed {
				t.Fatalf("first Begin: %v, %v", err, first)
			}
			type res struct {
				tx  stores.InboxTx
				err error
			}
			second := make(chan res, 1)
			go func() {
				tx, err := s.Begin(ctx, "wait", []string{key}, time.Hour)
				second <- res{tx, err}
			}()
			select {
			case r := <-second:
				t.Fatalf("second Begin returned (%v, %v) while the first transaction is open", r.tx, r.err)
			case <-time.After(200 * time.Millisecond):
			}
			if commit {
				if err := first.Commit(ctx, []byte("first")); err != nil {
					t.Fatal(err)
				}
			} else if err := first.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-second
			if r.err != nil {
				t.Fatalf("second Begin: %v", r.err)
			}
			if commit && (r.tx.Result() != stores.Duplicate || string(r.tx.Data()) != "first") {
				t.Fatalf("after commit: second Begin = %s with %q, want duplicate with %q", r.tx.Result(), r.tx.Data(), "first")
			}
			if !commit && r.tx.Result() != stores.Claimed {
				t.Fatalf("after rollback: second Begin = %s, want claimed", r.tx.Result())
			}
			if err := r.tx.Commit(ctx, nil); err != nil {
				t.Fatal(err)
			}
			// Rollback after Commit is a no-op; a second Commit is an error.
			if err := r.tx.Rollback(ctx); err != nil {
				t.Fatalf("Rollback after Commit: %v", err)
			}
			if !commit {
				if err := r.tx.Commit(ctx, nil); !errors.Is(err, sql.ErrTxDone) {
					t.Fatalf("second Commit = %v, want sql.ErrTxDone", err)
				}
			}
		}
	})
}

// TestInboxExpiryAndModes: an expired done record is replaced by Begin; a
// live lease-mode claim makes Begin report InProgress; multi-key
// Begins are all-or-nothing.
func TestInboxExpiryAndModes(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{Clock: clock})
		ctx := context.Background()
		begin := func(keys ...string) stores.InboxTx {
			t.Helper()
			tx, err := s.Begin(ctx, "modes", keys, time.Minute)
			if err != nil {
				t.Fatalf("Begin(%q): %v", keys, err)
			}
			return tx
		}
		tx := begin("a")
		if err := tx.Commit(ctx, []byte("A")); err != nil {
			t.Fatal(err)
		}
		if got := begin("a"); got.Result() != stores.Duplicate {
			t.Fatalf("live record: %s, want duplicate", got.Result())
		}
		// A multi-key Begin sharing a done key is a Duplicate and inserts
		// nothing: b stays free.
		if got := begin("b", "a"); got.Result() != stores.Duplicate || string(got.Data()) != "A" {
			t.Fatalf("multi-key with a done key: %s %q", got.Result(), got.Data())
		}
		if got := begin("b"); got.Result() != stores.Claimed {
			t.Fatalf("b after a rolled-back multi-key Begin: %s, want claimed", got.Result())
		} else if err := got.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Minute)
		tx = begin("a")
		if tx.Result() != stores.Claimed {
			t.Fatalf("expired record: %s, want claimed", tx.Result())
		}
		if err := tx.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if got := begin("a"); got.Result() != stores.Duplicate || len(got.Data()) != 0 {
			t.Fatalf("replaced record: %s %q, want duplicate without data", got.Result(), got.Data())
		}
		// A lease-mode claim of the same scope and key.
		c, err := s.Claim(ctx, "modes", []string{"leased"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim: %v %v", c, err)
		}
		if got := begin("leased"); got.Result() != stores.InProgress {
			t.Fatalf("Begin of a leased key = %s, want in_progress", got.Result())
		}
		clock.Advance(2 * time.Minute) // the lease ran out: Begin takes the key over
		if got := begin("leased"); got.Result() != stores.Claimed {
			t.Fatalf("Begin of an expired lease: %s", got.Result())
		} else if err := got.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c, time.Hour, nil); !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Complete of the taken-over lease = %v, want ErrLostClaim", err)
		}
		// Invalid input never reaches the database.
		if _, err := s.Begin(ctx, "modes", nil, time.Minute); !errors.Is(err, stores.ErrInvalidKey) {
			t.Fatalf("Begin without keys = %v", err)
		}
		if _, err := s.Begin(ctx, "modes", []string{"x"}, 0); !errors.Is(err, stores.ErrInvalidArgument) {
			t.Fatalf("Begin with zero retention = %v", err)
		}
	})
}

// TestInboxSavepoint: inside a caller's transaction (WithTx) each Begin is
// a savepoint. A failed attempt rolls back to it (its writes vanish, the
// outer transaction stays usable), the next attempt claims again, and the
// outer commit writes effect and record together.
func TestInboxSavepoint(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db, s, l := sqltest.LedgerStore(t, b, 1)
		ctx := context.Background()
		outer, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer outer.Rollback()
		octx := sqlstore.WithTx(ctx, outer)
		st := &sqltest.Stats{}
		e := sqltest.Event{ID: 1, Amount: 5}
		if err := sqltest.Process(octx, s, l, "sp", e, func() bool { return true }, st); err == nil {
			t.Fatal("the failing attempt succeeded")
		}
		if err := sqltest.Process(octx, s, l, "sp", e, nil, st); err != nil {
			t.Fatalf("second attempt in the same transaction: %v", err)
		}
		if err := sqltest.Process(octx, s, l, "sp", e, nil, st); err != nil || st.Duplicates.Load() != 1 {
			t.Fatalf("third attempt: %v, duplicates %d", err, st.Duplicates.Load())
		}
		if err := outer.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := l.Sum(t, db); got != 5 {
			t.Fatalf("ledger = %d, want 5", got)
		}
		if got := sqltest.CountRows(t, db, b.Dialect, s.Table()); got != 1 {
			t.Fatalf("inbox rows = %d, want 1", got)
		}
	})
}

// TestMiddlewareTransactional runs the ledger through the dedup middleware
// in transactional mode on a Watermill router with gochannel. Every event
// is published 1-3 times under new message ids and consumed by 8 handlers
// sharing one scope (gochannel fans out, so each copy reaches all of
// them, concurrently); 5% of first handler runs fail after their ledger
// write. The ledger sum must be exact and the inbox must hold one row per
// event.
func TestMiddlewareTransactional(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db, s, l := sqltest.LedgerStore(t, b, 8)
		const (
			events   = 300
			handlers = 8
		)
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
		defer ps.Close()
		router, mw := txRouter(t, s, "ledger", 10*time.Second)
		router.AddMiddleware(mw)

		var (
			failed  sync.Map // event id -> struct{}: its first run failed
			applied atomic.Int64
			want    int64
		)
		wantAcks := 0
		var acks atomic.Int64
		handler := func(msg *message.Message) error {
			defer acks.Add(1) // counts runs that return; acked ones are below
			tx, ok := sqlstore.TxFromContext(msg.Context())
			if !ok {
				return errors.New("no transaction in the handler context")
			}
			ev, _ := strconv.Atoi(msg.Metadata.Get("event_id"))
			amount, _ := strconv.Atoi(msg.Metadata.Get("amount"))
			if err := l.Add(msg.Context(), tx, ev%l.Accounts, amount); err != nil {
				return err
			}
			if ev%20 == 0 {
				if _, loaded := failed.LoadOrStore(ev, struct{}{}); !loaded {
					return errors.New("injected failure after the business write")
				}
			}
			applied.Add(1)
			return nil
		}
		for i := range handlers {
			router.AddConsumerHandler("ledger-"+strconv.Itoa(i), "events", ps, handler)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- router.Run(ctx) }()
		<-router.Running()

		for i := range events {
			amount := i%13 + 1
			want += int64(amount)
			for range 1 + i%3 {
				m := message.NewMessage(watermill.NewUUID(), nil)
				m.Metadata.Set("event_id", strconv.Itoa(i))
				m.Metadata.Set("amount", strconv.Itoa(amount))
				if err := ps.Publish("events", m); err != nil {
					t.Fatal(err)
				}
				wantAcks++
			}
		}
		// Wait until every event's record is committed and the ledger
		// settled.
		deadline := time.Now().Add(60 * time.Second)
		for sqltest.CountRows(t, db, b.Dialect, s.Table()) < events || l.Sum(t, db) < want {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %d of %d records, ledger %d of %d", sqltest.CountRows(t, db, b.Dialect, s.Table()), events, l.Sum(t, db), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // let any straggler show a double effect
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := l.Sum(t, db); got != want {
			t.Errorf("ledger sum = %d, want %d", got, want)
		}
		if got := sqltest.CountRows(t, db, b.Dialect, s.Table()); got != events {
			t.Errorf("inbox rows = %d, want %d", got, events)
		}
		if applied.Load() != events {
			t.Errorf("%d successful handler runs, want one per event (%d)", applied.Load(), events)
		}
		t.Logf("%s: %d copies x %d handlers, %d handler runs, %d effects", b.Dialect, wantAcks, handlers, acks.Load(), applied.Load())
	})
}
