package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestLockingReadsSortBeforeTheyLock: on PostgreSQL every read that locks
// several records sorts them by id before it locks them (LockRows above a
// Sort in the plan): the order in which a multi-key claim or Begin and the
// sorted batches lock. Without the sort PostgreSQL locks in heap order,
// and a fenced Release, Complete or Extend of a multi-key claim deadlocked
// with a multi-key claim or Begin of the same keys whenever the records
// lay in the heap out of id order (after a takeover, say), each cycle
// broken only after deadlock_timeout (TestFencedCallsBesideClaims).
func TestLockingReadsSortBeforeTheyLock(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{})
	for name, q := range sqlstore.LockingReads(s) {
		plan := explain(t, db, q.Stmt, q.Args)
		lock, sort := strings.Index(plan, "LockRows"), strings.Index(plan, "Sort")
		if lock < 0 || sort < lock {
			t.Errorf("%s: the plan does not sort below its LockRows:\n%s", name, plan)
		}
	}
}

func explain(t *testing.T, db *sql.DB, stmt string, args []any) string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", stmt, err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func pgDeadlocks(t testing.TB, db *sql.DB) int64 {
	t.Helper()
	_, _ = db.Exec("SELECT pg_stat_clear_snapshot()")
	var n int64
	if err := db.QueryRow("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func heapIDs(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT id::text FROM "` + table + `" ORDER BY ctid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	return ids
}

// reversedHeapClaim claims keys {k1,k2} as one claim whose records lie in
// the heap in the reverse of their id order: expired done records are
// created hi first, then taken over by the claim's UPDATE in heap order.
func reversedHeapClaim(t *testing.T, ctx context.Context, s *sqlstore.Store, db *sql.DB, table, scope string) *stores.Claim {
	t.Helper()
	mk := func(order []string) {
		for _, k := range order {
			c, err := s.Claim(ctx, scope, []string{k}, time.Hour)
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("claim %s: %v %v", k, c.Result, err)
			}
			if err := s.Complete(ctx, c, time.Millisecond, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk([]string{"k1", "k2"})
	if ids := heapIDs(t, db, table); ids[0] < ids[1] {
		if _, err := db.Exec(`DELETE FROM "` + table + `"`); err != nil {
			t.Fatal(err)
		}
		mk([]string{"k2", "k1"})
	}
	time.Sleep(20 * time.Millisecond)
	T, err := s.Claim(ctx, scope, []string{"k1", "k2"}, time.Hour)
	if err != nil || T.Result != stores.Claimed {
		t.Fatalf("claim T: %v %v", T.Result, err)
	}
	ids := heapIDs(t, db, table)
	if !(ids[0] > ids[1]) {
		t.Fatalf("heap order %v is not reversed", ids)
	}
	return T
}

type lat struct {
	n, slow, errs atomic.Int64
	max           atomic.Int64
	mu            sync.Mutex
	firstErr      error
}

func (l *lat) note(d time.Duration, err error) {
	l.n.Add(1)
	if d > 500*time.Millisecond {
		l.slow.Add(1)
	}
	if err != nil {
		l.errs.Add(1)
		l.mu.Lock()
		if l.firstErr == nil {
			l.firstErr = err
		}
		l.mu.Unlock()
	}
	for {
		m := l.max.Load()
		if int64(d) <= m || l.max.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (l *lat) String() string {
	return fmt.Sprintf("calls=%d errors=%d slow(>500ms)=%d max=%v firstErr=%v", l.n.Load(), l.errs.Load(), l.slow.Load(), time.Duration(l.max.Load()).Round(time.Millisecond), l.firstErr)
}

// TestFencedCallsBesideClaims: a multi-key claim T on {k1,k2}, whose
// records lie in the heap in the reverse of their id order, is Extended
// in a loop (a fenced call, which locks both records) while a contender
// claims the same keys (acquire: one id after the other, in id order): a
// multi-key Claim, a Begin in its own transaction, or a Begin joined to a
// caller's transaction. The contender must always see InProgress, and no
// call may fail: a deadlock between the two, which PostgreSQL breaks
// after deadlock_timeout, fails a joined Begin. (Deadlocks of the other
// modes are retried inside the store: they show as slow calls, logged
// here, and in pg_stat_database, which other tests share.)
func TestFencedCallsBesideClaims(t *testing.T) {
	for _, mode := range []string{"claim", "begin-own", "begin-joined"} {
		t.Run(mode, func(t *testing.T) {
			db := sqltest.OpenPostgres(t)
			table := "dedup_lockorder_" + storetest.NewID()
			s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{Table: table})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const scope = "rev"
			keys := []string{"k1", "k2"}
			T := reversedHeapClaim(t, ctx, s, db, table, scope)
			before := pgDeadlocks(t, db)
			var ext, con lat
			deadline := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					st := time.Now()
					err := s.Extend(ctx, T, time.Hour)
					ext.note(time.Since(st), err)
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					st := time.Now()
					var res stores.Result
					var err error
					switch mode {
					case "claim":
						var c *stores.Claim
						c, err = s.Claim(ctx, scope, keys, time.Hour)
						res = c.Result
					case "begin-own":
						var itx stores.InboxTx
						itx, err = s.Begin(ctx, scope, keys, time.Hour)
						if err == nil {
							res = itx.Result()
							_ = itx.Rollback(ctx)
						}
					case "begin-joined":
						tx, berr := db.BeginTx(ctx, nil)
						if berr != nil {
							t.Error(berr)
							return
						}
						var itx stores.InboxTx
						itx, err = s.Begin(sqlstore.WithTx(ctx, tx), scope, keys, time.Hour)
						if err == nil {
							res = itx.Result()
						}
						_ = tx.Rollback()
					}
					con.note(time.Since(st), err)
					if err == nil && res != stores.InProgress {
						t.Errorf("%s: %v, want InProgress", mode, res)
						return
					}
				}
			}()
			wg.Wait()
			dl := pgDeadlocks(t, db) - before
			t.Logf("extend: %s", &ext)
			t.Logf("%s: %s", mode, &con)
			t.Logf("pg_deadlocks=%d", dl)
			if ext.errs.Load() > 0 || con.errs.Load() > 0 {
				t.Errorf("%d extend errors, %d %s errors (%d deadlocks in the database meanwhile)", ext.errs.Load(), con.errs.Load(), mode, dl)
			}
		})
	}
}

// TestMultiKeyClaimSurvivesReleaseChurn checks that a multi-key claim
// meeting records that their owners keep releasing decides instead of
// giving up: a record found live by the claim's INSERT and released
// before it is locked is a key to insert again, not a failure. Churn
// workers claim and release one key of the pair, or one of it and a
// third key, in a tight loop while the claimer claims the pair; every
// claim must return a result.
func TestMultiKeyClaimSurvivesReleaseChurn(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const scope = "churn"
		pair := []string{"a", "b"}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				set := [][]string{{"a"}, {"b"}, {"b", "c"}, {"c", "a"}}[w%4]
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := s.Claim(ctx, scope, set, time.Minute)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("churn claim: %v", err)
						}
						return
					}
					if c.Result == stores.Claimed {
						if err := s.Release(ctx, c); err != nil {
							t.Errorf("churn release: %v", err)
							return
						}
					}
				}
			}()
		}
		var claimed, failed int
		for range 300 {
			c, err := s.Claim(ctx, scope, pair, time.Minute)
			if err != nil {
				failed++
				t.Logf("multi-key claim: %v", err)
				continue
			}
			if c.Result == stores.Claimed {
				claimed++
				if err := s.Release(ctx, c); err != nil {
					t.Fatalf("release: %v", err)
				}
			}
		}
		close(stop)
		wg.Wait()
		if failed > 0 {
			t.Errorf("%d of 300 multi-key claims failed under release churn (%d claimed)", failed, claimed)
		}
	})
}
