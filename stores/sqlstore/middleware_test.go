package sqlstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestMiddlewareTransactional runs the ledger through the dedup middleware
// in transactional mode on a Watermill router with gochannel. Every event
// is published 1-3 times under new message ids and consumed by 8 handlers
// sharing one scope (gochannel fans out, so each copy reaches all of
// them, concurrently); 5% of first handler runs fail after their ledger
// write. The ledger sum must be exact and the inbox must hold one row per
// event.
func TestMiddlewareTransactional(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db := b.open(t)
		s := newStore(t, db, b.dialect, sqlstore.Config{})
		l := newLedger(t, db, b.dialect, 8)
		const (
			events   = 300
			handlers = 8
		)
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
		defer ps.Close()
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := middleware.New(middleware.Config{
			Store:  s,
			Mode:   dedup.ModeTransactional,
			Scope:  "ledger",
			Key:    keyfuncs.Metadata("event_id"),
			Policy: dedup.Policy{Retention: time.Hour},
		})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(mw.Middleware)

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
			if err := l.add(msg.Context(), tx, ev%l.accounts, amount); err != nil {
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
		for countRows(t, db, b.dialect, s.Table()) < events || l.sum(t, db) < want {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %d of %d records, ledger %d of %d", countRows(t, db, b.dialect, s.Table()), events, l.sum(t, db), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // let any straggler show a double effect
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := l.sum(t, db); got != want {
			t.Errorf("ledger sum = %d, want %d", got, want)
		}
		if got := countRows(t, db, b.dialect, s.Table()); got != events {
			t.Errorf("inbox rows = %d, want %d", got, events)
		}
		if applied.Load() != events {
			t.Errorf("%d successful handler runs, want one per event (%d)", applied.Load(), events)
		}
		t.Logf("%s: %d copies x %d handlers, %d handler runs, %d effects", b.dialect, wantAcks, handlers, acks.Load(), applied.Load())
	})
}
