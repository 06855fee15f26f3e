package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mattn/go-sqlite3"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestPurgeJob checks the background job New starts: it purges, and Close
// stops it without leaking its goroutine.
func TestPurgeJob(t *testing.T) {
	db := openSQLite(t)
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	prep := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Clock: clock})
	ctx := context.Background()
	sqltest.Completed(t, prep, "job", "k", time.Second, time.Second)
	clock.Advance(time.Minute)

	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, err := sqlstore.New(db, sqlstore.Config{Table: prep.Table(), Clock: clock, PurgeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for sqltest.CountRows(t, db, sqlstore.SQLite, prep.Table()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the purge job did not delete the expired record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPurgeKeepsExpiredClaimsForTheLongestLease: the Store contract keeps
// an expired claim its owner's until its lease has been over for as long
// as the lease itself; a PurgeGrace shorter than the store's longest
// lease must not cut that short.
func TestPurgeKeepsExpiredClaimsForTheLongestLease(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		s := sqltest.NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{Clock: clock, PurgeGrace: time.Minute})
		ctx := context.Background()
		c, err := s.Claim(ctx, "p", []string{"slow"}, time.Hour)
		if err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		clock.Advance(time.Hour + 30*time.Minute) // the lease ended 30m ago, grace is 1m
		if _, err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
			t.Fatalf("Complete half a lease after the lease ended, after a Purge = %v; the purge forgot the claim too soon", err)
		}
	})
}

// TestSQLitePurge is sqlstore's TestPurge on SQLite (sqltest.RunPurge).
// The sizes of its batches are read from the table: each purge statement
// is the first write of a transaction of its own, and before it runs
// (sqliteHooks) another connection counts the records past their expiry,
// which only the purge changes meanwhile; the batches are the
// differences.
func TestSQLitePurge(t *testing.T) {
	h := &sqliteHooks{}
	db, path := sqliteWithHooks(t, h)
	reader := openOption(t, "sqlite3", sqlstore.SQLiteDSN(path), "SQLite", path)
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Clock: clock, PurgeBatch: 100, PurgeGrace: time.Minute})
	h.table.Store(s.Table())
	expired := func() int64 {
		var n int64
		// expires_at is in unix microseconds.
		q := `SELECT COUNT(*) FROM "` + s.Table() + `" WHERE expires_at < ?`
		if err := reader.QueryRowContext(context.Background(), q, clock.Now().UnixMicro()).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	sqltest.RunPurge(t, s, clock, func() sqltest.PurgeBatches {
		var mu sync.Mutex
		var before []int64 // expired records before each purge statement
		f := func(op int, inTx bool, calls int) int {
			if op == sqlite3.SQLITE_DELETE && inTx && calls == 0 {
				n := expired()
				mu.Lock()
				before = append(before, n)
				mu.Unlock()
			}
			return sqlite3.SQLITE_OK
		}
		h.onWrite.Store(&f)
		return func() (batches, largest int64) {
			h.onWrite.Store(nil)
			mu.Lock()
			defer mu.Unlock()
			counts := append(before, expired())
			for i := 1; i < len(counts); i++ {
				largest = max(largest, counts[i-1]-counts[i])
			}
			return int64(len(before)), largest
		}
	})
}
