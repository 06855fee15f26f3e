package sqltest

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

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Ledger is the business table of the transactional tests: handlers add
// each event's amount to an account's balance inside the inbox
// transaction.
type Ledger struct {
	d        sqlstore.Dialect
	table    string
	Accounts int
}

// ph is the i-th placeholder of a statement in dialect d.
func ph(d sqlstore.Dialect, i int) string {
	if d == sqlstore.Postgres {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// LedgerStore returns b's database, a store on it with the default
// Config, and a ledger of accounts accounts.
func LedgerStore(t testing.TB, b Backend, accounts int) (*sql.DB, *sqlstore.Store, *Ledger) {
	t.Helper()
	db := b.Open(t)
	return db, NewStore(t, db, b.Dialect, sqlstore.Config{}), NewLedger(t, db, b.Dialect, accounts)
}

// NewLedger creates a ledger of accounts accounts (balance 0) in db, a
// table of its own that t.Cleanup drops.
func NewLedger(t testing.TB, db *sql.DB, d sqlstore.Dialect, accounts int) *Ledger {
	t.Helper()
	l := &Ledger{d: d, table: "ledger_" + storetest.NewID(), Accounts: accounts}
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, fmt.Sprintf("CREATE TABLE %s (account INTEGER PRIMARY KEY, balance BIGINT NOT NULL)", l.table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DropTable(t, db, d, l.table) })
	var vals []string
	for i := range accounts {
		vals = append(vals, fmt.Sprintf("(%d, 0)", i))
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (account, balance) VALUES %s", l.table, strings.Join(vals, ", "))); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *Ledger) Add(ctx context.Context, tx *sql.Tx, account, amount int) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET balance = balance + %s WHERE account = %s", l.table, ph(l.d, 1), ph(l.d, 2)), amount, account)
	return err
}

func (l *Ledger) Sum(t testing.TB, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(context.Background(), "SELECT COALESCE(SUM(balance), 0) FROM "+l.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type Event struct {
	ID     int
	Amount int
}

func (e Event) Key() string       { return fmt.Sprintf("evt-%06d", e.ID) }
func (e Event) Data() []byte      { return []byte("out:" + e.Key()) }
func (e Event) Account(n int) int { return e.ID % n }

// Stats counts what the deliveries saw.
type Stats struct {
	Duplicates, Failures, StoreErrors, Committed atomic.Int64
}

// Process is one consumer's handling of one delivery, the way the
// middleware drives an Inbox: Begin; on Duplicate ack; else run the
// handler inside the transaction, Commit on success, Rollback on error.
// It returns nil when the delivery may be acked, an error for a nack.
func Process(ctx context.Context, s stores.Inbox, l *Ledger, scope string, e Event, failAfterWrite func() bool, st *Stats) error {
	itx, err := s.Begin(ctx, scope, []string{e.Key()}, time.Hour)
	if err != nil {
		st.StoreErrors.Add(1)
		return err
	}
	if itx.Result() == stores.Duplicate {
		st.Duplicates.Add(1)
		if string(itx.Data()) != string(e.Data()) {
			return fmt.Errorf("duplicate of %s carries data %q, want %q", e.Key(), itx.Data(), e.Data())
		}
		return nil
	}
	hctx := itx.Context(ctx)
	tx, ok := sqlstore.TxFromContext(hctx)
	if !ok {
		_ = itx.Rollback(ctx)
		return errors.New("no transaction in the handler context")
	}
	if err := l.Add(hctx, tx, e.Account(l.Accounts), e.Amount); err != nil {
		_ = itx.Rollback(ctx)
		st.StoreErrors.Add(1)
		return err
	}
	if failAfterWrite != nil && failAfterWrite() {
		st.Failures.Add(1)
		if err := itx.Rollback(ctx); err != nil {
			return errors.Join(errors.New("handler failed"), err)
		}
		return errors.New("handler failed after its business write")
	}
	if err := itx.Commit(ctx, e.Data()); err != nil {
		st.StoreErrors.Add(1)
		return err
	}
	st.Committed.Add(1)
	return nil
}

// LedgerRun delivers events (each 1 to maxCopies times, shuffled) to
// workers that redeliver on every nack until acked. 5% of the events fail
// their first attempt after the business write.
type LedgerRun struct {
	Events    int
	MaxCopies int
	Workers   int
	// deadline bounds the redeliveries of one delivery.
	Deadline time.Duration
	// afterAck, if set, is called after every ack with the number so far.
	AfterAck func(n int64)
	// faults says the run injects store faults: a COMMIT whose outcome the
	// client never learnt may be counted as failed, then found as a
	// Duplicate by the redelivery.
	Faults bool
}

// RunLedger runs 2000 events on s and l over db (each delivered 1-3
// times, by 64 workers) and checks the ledger's sum and one inbox row an
// Event; it returns the number of events and the run's stats.
func RunLedger(t *testing.T, db *sql.DB, d sqlstore.Dialect, s *sqlstore.Store, l *Ledger) (int, *Stats) {
	t.Helper()
	r := LedgerRun{Events: 2000, MaxCopies: 3, Workers: 64, Deadline: 5 * time.Minute}
	want, st := r.Run(t, s, l)
	if got := l.Sum(t, db); got != want {
		t.Errorf("ledger sum = %d, want %d", got, want)
	}
	if got := CountRows(t, db, d, s.Table()); got != r.Events {
		t.Errorf("inbox rows = %d, want %d", got, r.Events)
	}
	return r.Events, st
}

func (r LedgerRun) Run(t *testing.T, s stores.Inbox, l *Ledger) (want int64, st *Stats) {
	t.Helper()
	st = &Stats{}
	scope := "ledger-" + storetest.NewID()
	rng := rand.New(rand.NewPCG(1, 2))
	var deliveries []Event
	for i := range r.Events {
		e := Event{ID: i, Amount: 1 + rng.IntN(1000)}
		want += int64(e.Amount)
		for range 1 + rng.IntN(r.MaxCopies) {
			deliveries = append(deliveries, e)
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
	failed := make([]atomic.Bool, r.Events) // first attempt of event i already failed

	ch := make(chan Event)
	var (
		wg    sync.WaitGroup
		acked atomic.Int64
		errMu sync.Mutex
		fatal error
	)
	ctx := context.Background()
	for range r.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range ch {
				start := time.Now()
				for {
					// The first attempt that gets to run the handler fails.
					fail := func() bool { return e.ID%20 == 0 && failed[e.ID].CompareAndSwap(false, true) }
					err := Process(ctx, s, l, scope, e, fail, st)
					if err == nil {
						break
					}
					if strings.Contains(err.Error(), "carries data") || strings.Contains(err.Error(), "no transaction") || time.Since(start) > r.Deadline {
						errMu.Lock()
						fatal = errors.Join(fatal, fmt.Errorf("event %d: %w", e.ID, err))
						errMu.Unlock()
						break
					}
					time.Sleep(time.Millisecond) // the broker's redelivery delay
				}
				n := acked.Add(1)
				if r.AfterAck != nil {
					r.AfterAck(n)
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
	if got := st.Duplicates.Load() + st.Committed.Load(); got != int64(len(deliveries)) {
		t.Fatalf("%d deliveries acked as duplicate or committed, want %d", got, len(deliveries))
	}
	if !r.Faults && st.Committed.Load() != int64(r.Events) {
		t.Errorf("%d commits, want one per event (%d)", st.Committed.Load(), r.Events)
	}
	return want, st
}

// NewInboxFixture returns the storetest fixture of a new store over db
// (cfg's table, a fresh one by default) and of an effects table of its
// own; t.Cleanup drops both.
func NewInboxFixture(t *testing.T, db *sql.DB, d sqlstore.Dialect, cfg sqlstore.Config) storetest.InboxFixture {
	t.Helper()
	s := NewStore(t, db, d, cfg)
	fx := newEffectsTable(t, db, d)
	fx.Store = s
	fx.BeginOuter = func(ctx context.Context) (storetest.OuterTx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return SQLOuter{Tx: tx}, nil
	}
	switch d {
	case sqlstore.Postgres:
		fx.AbortOuter = []storetest.OuterAbort{{Name: "failed-statement", Abort: pgFailStatement}}
	case sqlstore.MySQL:
		fx.AbortOuter = []storetest.OuterAbort{{Name: "deadlock", Abort: mysqlDeadlockAbort(t, db)}}
	case sqlstore.SQLite:
		fx.OuterExclusive = true
	}
	return fx
}

// newEffectsTable creates the business table of an Inbox fixture: one
// row per effect, with no key, so a duplicate effect is a second row.
// It returns a fixture with WriteEffect and CountEffects set.
func newEffectsTable(t *testing.T, db *sql.DB, d sqlstore.Dialect) storetest.InboxFixture {
	t.Helper()
	fx, _ := NewEffectsTableNamed(t, db, d)
	return fx
}

// NewEffectsTableNamed is newEffectsTable, which also returns the table.
func NewEffectsTableNamed(t *testing.T, db *sql.DB, d sqlstore.Dialect) (storetest.InboxFixture, string) {
	t.Helper()
	table := "effects_" + storetest.NewID()
	ddl := fmt.Sprintf(`CREATE TABLE "%s" (k TEXT NOT NULL)`, table)
	if d == sqlstore.MySQL {
		ddl = fmt.Sprintf("CREATE TABLE `%s` (k VARCHAR(1024) NOT NULL) ENGINE = InnoDB", table)
	}
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatalf("creating %s: %v", table, err)
	}
	t.Cleanup(func() { DropTable(t, db, d, table) })
	return storetest.InboxFixture{
		WriteEffect: func(ctx context.Context, key string) error {
			tx, ok := sqlstore.TxFromContext(ctx)
			if !ok {
				return errors.New("no transaction in the context (sqlstore.TxFromContext)")
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (k) VALUES (%s)", table, ph(d, 1)), key)
			return err
		},
		CountEffects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE k = %s", table, ph(d, 1)), key).Scan(&n)
			return n, err
		},
	}, table
}

// SQLOuter is a caller's *sql.Tx as a storetest.OuterTx.
type SQLOuter struct{ Tx *sql.Tx }

func (o SQLOuter) Context(parent context.Context) context.Context {
	return sqlstore.WithTx(parent, o.Tx)
}

func (o SQLOuter) Commit(context.Context) error { return o.Tx.Commit() }

func (o SQLOuter) Rollback(context.Context) error { return o.Tx.Rollback() }

// pgFailStatement aborts a PostgreSQL transaction the way any failed
// statement does: the server refuses every later statement of it
// (SQLSTATE 25P02) until it is rolled back.
func pgFailStatement(ctx context.Context, outer storetest.OuterTx) error {
	tx := outer.(SQLOuter).Tx
	if _, err := tx.ExecContext(ctx, "SELECT 1/0"); err == nil {
		return errors.New("SELECT 1/0 succeeded")
	}
	var one int
	err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) || pg.SQLState() != "25P02" {
		return fmt.Errorf("after a failed statement the transaction still answers (%v): it was not aborted", err)
	}
	return nil
}

// mysqlDeadlockAbort returns an AbortOuter for MySQL/MariaDB: the outer
// transaction loses a deadlock against a heavier transaction, so InnoDB
// rolls all of it back on the server while the client's *sql.Tx stays
// open (its later statements would run in autocommit). Its table is made
// on first use and dropped by t.Cleanup.
func mysqlDeadlockAbort(t *testing.T, db *sql.DB) func(ctx context.Context, outer storetest.OuterTx) error {
	var (
		once  sync.Once
		table = "abort_" + storetest.NewID()
		err   error
	)
	return func(ctx context.Context, outer storetest.OuterTx) error {
		once.Do(func() {
			if _, err = db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB"); err != nil {
				return
			}
			t.Cleanup(func() { DropTable(t, db, sqlstore.MySQL, table) })
			rows := make([]string, 64)
			for i := range rows {
				rows[i] = fmt.Sprintf("(%d, 0)", i)
			}
			_, err = db.ExecContext(ctx, "INSERT INTO "+table+" VALUES "+strings.Join(rows, ", "))
		})
		if err != nil {
			return fmt.Errorf("preparing the deadlock table: %w", err)
		}
		return mySQLLoseDeadlock(ctx, db, outer.(SQLOuter).Tx, table)
	}
}

// mySQLLoseDeadlock makes outer the victim of a deadlock on table's rows
// 0 and 1. InnoDB rolls back the transaction that changed fewer rows:
// the other one first changes every row but 0.
func mySQLLoseDeadlock(ctx context.Context, db *sql.DB, outer *sql.Tx, table string) error {
	heavy, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = heavy.Rollback() }()
	if _, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id >= 1"); err != nil {
		return fmt.Errorf("heavy transaction: %w", err)
	}
	if _, err := outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0"); err != nil {
		return fmt.Errorf("outer transaction: %w", err)
	}
	heavyDone := make(chan error, 1)
	go func() {
		// Waits for outer's row 0...
		_, err := heavy.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 0")
		heavyDone <- err
	}()
	// ...while outer waits for heavy's row 1: whichever comes second
	// closes the cycle, and InnoDB picks outer, the lighter, as victim.
	_, victimErr := outer.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = 1")
	var my *mysql.MySQLError
	if !errors.As(victimErr, &my) || my.Number != 1213 {
		_ = outer.Rollback() // let heavy through
		return fmt.Errorf("outer transaction's second update = %v (heavy's: %v), want a deadlock (1213)", victimErr, <-heavyDone)
	}
	heavyErr := <-heavyDone
	if heavyErr != nil {
		return fmt.Errorf("heavy transaction after the deadlock: %w", heavyErr)
	}
	return nil
}
