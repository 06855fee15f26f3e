package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

var errBatchBoom = errors.New("batch statement failed (injected)")

// gate is a sqltest.Gate that the store's batch hook enters, and which
// records the size of every batch; with fail, every batch of several
// calls fails as if its statement had.
type gate struct {
	*sqltest.Gate
	mu    sync.Mutex
	sizes []int
	fail  atomic.Bool
}

func newGate(t *testing.T, s *sqlstore.Store) *gate {
	g := &gate{Gate: sqltest.NewGate(t, s)}
	if !sqlstore.SetBatchHook(s, g.hook) {
		t.Fatal("the store does not batch")
	}
	return g
}

func (g *gate) hook(n int) error {
	g.mu.Lock()
	g.sizes = append(g.sizes, n)
	g.mu.Unlock()
	g.Enter(n > 1)
	if g.fail.Load() {
		return errBatchBoom
	}
	return nil
}

func (g *gate) batchSizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...)
}

func newBatchStore(t *testing.T, b sqltest.Backend, clock stores.Clock) *sqlstore.Store {
	return sqltest.NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{MaxInFlight: 1}})
}

// TestBatchLoneCallerRunsAlone: calls that never overlap each run at
// once in a batch of their own.
func TestBatchLoneCallerRunsAlone(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		s := newBatchStore(t, b, nil)
		var sizes []int
		var mu sync.Mutex
		sqlstore.SetBatchHook(s, func(n int) error {
			mu.Lock()
			sizes = append(sizes, n)
			mu.Unlock()
			return nil
		})
		ctx := context.Background()
		for i := range 10 {
			c, err := s.Claim(ctx, "lone", []string{fmt.Sprint("k", i)}, time.Minute)
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("Claim: %+v %v", c, err)
			}
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
		}
		if len(sizes) != 20 {
			t.Fatalf("%d batches for 20 sequential calls, want 20: %v", len(sizes), sizes)
		}
		for _, n := range sizes {
			if n != 1 {
				t.Fatalf("a sequential call ran in a batch of %d: %v", n, sizes)
			}
		}
	})
}

// TestBatchSharesStatements: calls made while a batch runs queue and then
// run together, in one batch (one statement or transaction), each with
// its own result.
func TestBatchSharesStatements(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		s := newBatchStore(t, b, nil)
		g := newGate(t, s)
		sqltest.RunBatchSharesStatements(t, s, g.Gate, func(min int) {
			if sizes := g.batchSizes(); len(sizes) < 2 || sizes[1] < min {
				t.Fatalf("batch sizes %v: want the queued calls to share batches", sizes)
			}
		})
		t.Logf("%s: batch sizes %v", b.Dialect, g.batchSizes())
	})
}

// runMixed runs the calls of sqltest.PrepareMixed together on a batching
// store of b, its batch statement failing when fail, and returns the
// sizes of the batches.
func runMixed(t *testing.T, b sqltest.Backend, fail bool) []int {
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := newBatchStore(t, b, clock)
	m := sqltest.PrepareMixed(t, s, clock)
	g := newGate(t, s)
	g.fail.Store(fail)
	sqltest.RunBatchMixed(t, m, g.Gate)
	return g.batchSizes()
}

// TestBatchMixedResults: one batch holding claims of every outcome
// (new, duplicate with data, in progress, expired takeover, the same key
// twice) and Completes, a stale Complete, a Release and an Extend gives
// each call its own result.
func TestBatchMixedResults(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		sizes := runMixed(t, b, false)
		if len(sizes) < 2 || sizes[1] < 8 {
			t.Fatalf("batch sizes %v: want the mixed calls in one batch", sizes)
		}
		t.Logf("%s: batch sizes %v", b.Dialect, sizes)
	})
}

// TestBatchStatementFailure: when a batch's statement fails, its calls
// run on their own and still get their own results.
func TestBatchStatementFailure(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		if sizes := runMixed(t, b, true); len(sizes) < 2 || sizes[1] < 2 {
			t.Fatalf("batch sizes %v: want a failed batch of several calls", sizes)
		}
	})
}

// TestBatchOrphanedClaimReleased: a caller that gives up while its batch
// runs gets its context's error, and the claim the batch made for it is
// released, so the next delivery is not held up for a lease.
func TestBatchOrphanedClaimReleased(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		s := newBatchStore(t, b, nil)
		sqltest.RunBatchOrphanedClaimReleased(t, s, newGate(t, s).Gate)
	})
}

// TestBatchConfigValidate checks the bounds of BatchConfig.
func TestBatchConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		b    sqlstore.BatchConfig
		want string
	}{
		{sqlstore.BatchConfig{MaxBatch: -1}, "Batch.MaxBatch"},
		{sqlstore.BatchConfig{MaxBatch: sqlstore.MaxBatchLimit + 1}, "1000"},
		{sqlstore.BatchConfig{MaxInFlight: -1}, "Batch.MaxInFlight"},
		{sqlstore.BatchConfig{MaxInFlight: sqlstore.MaxInFlightLimit + 1}, "64"},
	} {
		err := sqlstore.Config{Batch: tc.b}.Validate()
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("Validate(Batch %+v) = %v, want an error naming %s", tc.b, err, tc.want)
		}
	}
	if err := (sqlstore.Config{Batch: sqlstore.BatchConfig{MaxBatch: sqlstore.MaxBatchLimit, MaxInFlight: sqlstore.MaxInFlightLimit}}).Validate(); err != nil {
		t.Errorf("the largest Batch values: %v", err)
	}
}

// TestPostgresCompleteIsHOT: on the plain PostgreSQL layout no index
// covers a column Complete changes, so its updates are HOT (no new
// primary-key entry per record).
func TestPostgresCompleteIsHOT(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{})
	ctx := context.Background()
	const n = 200
	for i := range n {
		c, err := s.Claim(ctx, "hot", []string{fmt.Sprint("k", i)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
			t.Fatal(err)
		}
	}
	var idx int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_indexes WHERE tablename = $1", s.Table()).Scan(&idx); err != nil {
		t.Fatal(err)
	}
	if idx != 1 {
		t.Fatalf("%d indexes, want only the primary key", idx)
	}
	// Statistics reach pg_stat_user_tables once the backends flush them
	// (PostgreSQL 15: within about 10s of going idle), however long a
	// loaded machine makes that.
	upd, hot := pgTableStats(t, db, s.Table(), "n_tup_hot_upd", n)
	if hot < upd*9/10 {
		t.Fatalf("%d of %d updates HOT, want nearly all", hot, upd)
	}
	t.Logf("%d of %d updates HOT", hot, upd)
}

// pgTableStats waits up to 2 minutes for pg_stat_user_tables to report
// at least n updates of table, and returns them with the statistic
// column.
func pgTableStats(t *testing.T, db *sql.DB, table, column string, n int64) (upd, other int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := db.QueryRowContext(context.Background(), "SELECT n_tup_upd, "+column+" FROM pg_stat_user_tables WHERE relname = $1", table).Scan(&upd, &other); err != nil {
			t.Fatal(err)
		}
		if upd >= n {
			return upd, other
		}
		if time.Now().After(deadline) {
			t.Fatalf("statistics not reported after 2 minutes (%d updates of %d)", upd, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPostgresBatchPlansUseTheIndex: a table analyzed while empty (and
// not since: autovacuum off) makes PostgreSQL cache sequential-scan plans
// for primary-key lookups; batches plan theirs with sequential scans off,
// so batched Completes stay index lookups as the table grows. (A lone
// call runs the unbatched statements, whose plans autovacuum's ANALYZE
// refreshes: those few may scan.)
func TestPostgresBatchPlansUseTheIndex(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s := sqltest.NewStore(t, db, sqlstore.Postgres, sqlstore.Config{Batch: sqlstore.BatchConfig{MaxInFlight: 1}})
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+s.Table()); err != nil {
		t.Fatal(err)
	}
	const n = 1500
	sqltest.Bounded(n, 8, func(i int) {
		c, err := s.Claim(ctx, "plans", []string{fmt.Sprint("k", i)}, time.Minute)
		if err == nil {
			err = s.Complete(ctx, c, time.Hour, nil)
		}
		if err != nil {
			t.Error(err)
		}
	})
	// Once the backends flush their statistics (see above).
	upd, seq := pgTableStats(t, db, s.Table(), "seq_scan", n)
	if seq > n/10 {
		t.Fatalf("%d sequential scans for %d Completes", seq, upd)
	}
	t.Logf("%d sequential scans (lone calls) for %d Completes", seq, upd)
}
