package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
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
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// ledger is the business table of the transactional tests: handlers add
// each event's amount to an account's balance inside the inbox
// transaction.
type ledger struct {
	d        sqlstore.Dialect
	table    string
	accounts int
}

func ph(d sqlstore.Dialect, i int) string {
	if d == sqlstore.Postgres {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// ledgerStore returns b's database, a store on it with the default
// Config, and a ledger of accounts accounts.
func ledgerStore(t testing.TB, b backend, accounts int) (*sql.DB, *sqlstore.Store, *ledger) {
	t.Helper()
	db := b.open(t)
	return db, newStore(t, db, b.dialect, sqlstore.Config{}), newLedger(t, db, b.dialect, accounts)
}

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

func newLedger(t testing.TB, db *sql.DB, d sqlstore.Dialect, accounts int) *ledger {
	t.Helper()
	l := &ledger{d: d, table: "ledger_" + storetest.NewID(), accounts: accounts}
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, fmt.Sprintf("CREATE TABLE %s (account INTEGER PRIMARY KEY, balance BIGINT NOT NULL)", l.table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropTable(t, db, d, l.table) })
	var vals []string
	for i := range accounts {
		vals = append(vals, fmt.Sprintf("(%d, 0)", i))
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (account, balance) VALUES %s", l.table, strings.Join(vals, ", "))); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *ledger) add(ctx context.Context, tx *sql.Tx, account, amount int) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET balance = balance + %s WHERE account = %s", l.table, ph(l.d, 1), ph(l.d, 2)), amount, account)
	return err
}

func (l *ledger) sum(t testing.TB, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(context.Background(), "SELECT COALESCE(SUM(balance), 0) FROM "+l.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type event struct {
	id     int
	amount int
}

func (e event) key() string       { return fmt.Sprintf("evt-%06d", e.id) }
func (e event) data() []byte      { return []byte("out:" + e.key()) }
func (e event) account(n int) int { return e.id % n }

// stats counts what the deliveries saw.
type stats struct {
	duplicates, failures, storeErrors, committed atomic.Int64
}

// process is one consumer's handling of one delivery, the way the
// middleware drives an Inbox: Begin; on Duplicate ack; else run the
// handler inside the transaction, Commit on success, Rollback on error.
// It returns nil when the delivery may be acked, an error for a nack.
func process(ctx context.Context, s stores.Inbox, l *ledger, scope string, e event, failAfterWrite func() bool, st *stats) error {
	itx, err := s.Begin(ctx, scope, []string{e.key()}, time.Hour)
	if err != nil {
		st.storeErrors.Add(1)
		return err
	}
	if itx.Result() == stores.Duplicate {
		st.duplicates.Add(1)
		if string(itx.Data()) != string(e.data()) {
			return fmt.Errorf("duplicate of %s carries data %q, want %q", e.key(), itx.Data(), e.data())
		}
		return nil
	}
	hctx := itx.Context(ctx)
	tx, ok := sqlstore.TxFromContext(hctx)
	if !ok {
		_ = itx.Rollback(ctx)
		return errors.New("no transaction in the handler context")
	}
	if err := l.add(hctx, tx, e.account(l.accounts), e.amount); err != nil {
		_ = itx.Rollback(ctx)
		st.storeErrors.Add(1)
		return err
	}
	if failAfterWrite != nil && failAfterWrite() {
		st.failures.Add(1)
		if err := itx.Rollback(ctx); err != nil {
			return errors.Join(errors.New("handler failed"), err)
		}
		return errors.New("handler failed after its business write")
	}
	if err := itx.Commit(ctx, e.data()); err != nil {
		st.storeErrors.Add(1)
		return err
	}
	st.committed.Add(1)
	return nil
}

// ledgerRun delivers events (each 1 to maxCopies times, shuffled) to
// workers that redeliver on every nack until acked. 5% of the events fail
// their first attempt after the business write.
type ledgerRun struct {
	events    int
	maxCopies int
	workers   int
	// deadline bounds the redeliveries of one delivery.
	deadline time.Duration
	// afterAck, if set, is called after every ack with the number so far.
	afterAck func(n int64)
	// faults says the run injects store faults: a COMMIT whose outcome the
	// client never learnt may be counted as failed, then found as a
	// Duplicate by the redelivery.
	faults bool
}

// runLedger runs 2000 events on s and l over db (each delivered 1-3
// times, by 64 workers) and checks the ledger's sum and one inbox row an
// event; it returns the number of events and the run's stats.
func runLedger(t *testing.T, db *sql.DB, d sqlstore.Dialect, s *sqlstore.Store, l *ledger) (int, *stats) {
	t.Helper()
	r := ledgerRun{events: 2000, maxCopies: 3, workers: 64, deadline: 5 * time.Minute}
	want, st := r.run(t, s, l)
	if got := l.sum(t, db); got != want {
		t.Errorf("ledger sum = %d, want %d", got, want)
	}
	if got := countRows(t, db, d, s.Table()); got != r.events {
		t.Errorf("inbox rows = %d, want %d", got, r.events)
	}
	return r.events, st
}

func (r ledgerRun) run(t *testing.T, s stores.Inbox, l *ledger) (want int64, st *stats) {
	t.Helper()
	st = &stats{}
	scope := "ledger-" + storetest.NewID()
	rng := rand.New(rand.NewPCG(1, 2))
	var deliveries []event
	for i := range r.events {
		e := event{id: i, amount: 1 + rng.IntN(1000)}
		want += int64(e.amount)
		for range 1 + rng.IntN(r.maxCopies) {
			deliveries = append(deliveries, e)
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
	failed := make([]atomic.Bool, r.events) // first attempt of event i already failed

	ch := make(chan event)
	var (
		wg    sync.WaitGroup
		acked atomic.Int64
		errMu sync.Mutex
		fatal error
	)
	ctx := context.Background()
	for range r.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range ch {
				start := time.Now()
				for {
					// The first attempt that gets to run the handler fails.
					fail := func() bool { return e.id%20 == 0 && failed[e.id].CompareAndSwap(false, true) }
					err := process(ctx, s, l, scope, e, fail, st)
					if err == nil {
						break
					}
					if strings.Contains(err.Error(), "carries data") || strings.Contains(err.Error(), "no transaction") || time.Since(start) > r.deadline {
						errMu.Lock()
						fatal = errors.Join(fatal, fmt.Errorf("event %d: %w", e.id, err))
						errMu.Unlock()
						break
					}
					time.Sleep(time.Millisecond) // the broker's redelivery delay
				}
				n := acked.Add(1)
				if r.afterAck != nil {
					r.afterAck(n)
				}
			}
		}()
	}
	for _, e := range deliveries {
		ch <- e
	}
	close(ch)
	wg.Wait()
	if fatal != nil {
		t.Fatal(fatal)
	}
	if got := st.duplicates.Load() + st.committed.Load(); got != int64(len(deliveries)) {
		t.Fatalf("%d deliveries acked as duplicate or committed, want %d", got, len(deliveries))
	}
	if !r.faults && st.committed.Load() != int64(r.events) {
		t.Errorf("%d commits, want one per event (%d)", st.committed.Load(), r.events)
	}
	return want, st
}

// TestInboxLedger is the transactional acceptance test: 2,000 events,
// each delivered 1-3 times, 64 concurrent workers, 5% of first attempts
// failing after their business write. The ledger sum must be exact and
// the inbox must hold one row per event.
func TestInboxLedger(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db, s, l := ledgerStore(t, b, 16)
		events, st := runLedger(t, db, b.dialect, s, l)
		if st.failures.Load() != int64(events/20) {
			t.Errorf("%d injected failures, want %d", st.failures.Load(), events/20)
		}
		t.Logf("%s: %d duplicates, %d failed first attempts, %d store errors (retried)", b.dialect, st.duplicates.Load(), st.failures.Load(), st.storeErrors.Load())
	})
}

// TestInboxCrashAfterCommit: the transaction commits, then the consumer
// dies before acking; the broker redelivers. The redelivery is a Duplicate
// with the committed data and has no second effect.
func TestInboxCrashAfterCommit(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db, s, l := ledgerStore(t, b, 1)
		ctx := context.Background()
		e := event{id: 7, amount: 42}
		st := &stats{}
		if err := process(ctx, s, l, "crash", e, nil, st); err != nil {
			t.Fatal(err)
		}
		// crash: no ack. Redelivered twice.
		for range 2 {
			if err := process(ctx, s, l, "crash", e, nil, st); err != nil {
				t.Fatal(err)
			}
		}
		if st.committed.Load() != 1 || st.duplicates.Load() != 2 {
			t.Fatalf("committed %d, duplicates %d; want 1 and 2", st.committed.Load(), st.duplicates.Load())
		}
		if got := l.sum(t, db); got != 42 {
			t.Fatalf("ledger = %d, want 42", got)
		}
	})
}

// TestInboxConcurrentDuplicateWaits: a second Begin of a key whose first
// transaction is open waits on the primary key, then reports Duplicate
// when the first commits, or claims the key when it rolls back.
func TestInboxConcurrentDuplicateWaits(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db := b.open(t)
		s := newStore(t, db, b.dialect, sqlstore.Config{})
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
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db := b.open(t)
		clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		s := newStore(t, db, b.dialect, sqlstore.Config{Clock: clock})
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
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db, s, l := ledgerStore(t, b, 1)
		ctx := context.Background()
		outer, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer outer.Rollback()
		octx := sqlstore.WithTx(ctx, outer)
		st := &stats{}
		e := event{id: 1, amount: 5}
		if err := process(octx, s, l, "sp", e, func() bool { return true }, st); err == nil {
			t.Fatal("the failing attempt succeeded")
		}
		if err := process(octx, s, l, "sp", e, nil, st); err != nil {
			t.Fatalf("second attempt in the same transaction: %v", err)
		}
		if err := process(octx, s, l, "sp", e, nil, st); err != nil || st.duplicates.Load() != 1 {
			t.Fatalf("third attempt: %v, duplicates %d", err, st.duplicates.Load())
		}
		if err := outer.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := l.sum(t, db); got != 5 {
			t.Fatalf("ledger = %d, want 5", got)
		}
		if got := countRows(t, db, b.dialect, s.Table()); got != 1 {
			t.Fatalf("inbox rows = %d, want 1", got)
		}
	})
}

// TestConnectionCut cuts every database connection mid-stream through a
// test-owned TCP proxy, then restores it: no effect lost, none doubled
// (an ambiguous COMMIT is resolved by the redelivery finding the record),
// and the store works again after Restore.
func TestConnectionCut(t *testing.T) {
	forEachBackend(t, serverBackends, func(t *testing.T, b backend) {
		direct := b.open(t)
		s, _, p := proxiedStore(t, b, sqlstore.Config{})
		table := s.Table()
		l := newLedger(t, direct, b.dialect, 8)

		var cutOnce, restoreOnce sync.Once
		restored := make(chan struct{})
		r := ledgerRun{events: 600, maxCopies: 2, workers: 16, deadline: 5 * time.Minute, faults: true,
			afterAck: func(n int64) {
				if n == 150 {
					cutOnce.Do(func() {
						p.Cut()
						time.AfterFunc(300*time.Millisecond, func() {
							restoreOnce.Do(func() { p.Restore(); close(restored) })
						})
					})
				}
			}}
		want, st := r.run(t, s, l)
		<-restored
		if got := l.sum(t, direct); got != want {
			t.Errorf("ledger sum = %d, want %d (an effect was lost or doubled)", got, want)
		}
		if got := countRows(t, direct, b.dialect, table); got != r.events {
			t.Errorf("inbox rows = %d, want %d", got, r.events)
		}
		if st.storeErrors.Load() == 0 {
			t.Error("the cut caused no store error: the proxy did not cut anything")
		}
		// The lease mode recovers too.
		c, err := s.Claim(context.Background(), "after-cut", []string{"k"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim after Restore: %v, %v", c, err)
		}
		t.Logf("%s: %d store errors during the cut, all retried", b.dialect, st.storeErrors.Load())
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
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		db, s, l := ledgerStore(t, b, 8)
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
