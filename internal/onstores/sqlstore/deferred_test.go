package sqlstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestSQLiteDeferredTransactions: with the DSN most mattn/go-sqlite3
// users write (WAL and a busy timeout, but deferred transactions), a
// transaction of the store's own that read before it wrote could not
// upgrade its lock when another writer had committed since its read:
// SQLite answers SQLITE_BUSY at once, without its busy timeout, every
// retry met the same, and a multi-key Complete, Extend or Release, or an
// admin Delete, failed as unavailable ("release: database is locked",
// seen under contention). Here another connection commits a write each
// time the store prepares a write on its table (sqliteHooks): the
// store's transactions take the write lock before they read, so that
// writer waits (and, with no busy timeout of its own, gives up) instead,
// and every call succeeds.
func TestSQLiteDeferredTransactions(t *testing.T) {
	for _, batch := range []sqlstore.BatchConfig{{Disabled: true}, {}} {
		t.Run(map[bool]string{true: "unbatched", false: "group-commit"}[batch.Disabled], func(t *testing.T) {
			deferredTransactions(t, batch)
		})
	}
}

func deferredTransactions(t *testing.T, batch sqlstore.BatchConfig) {
	h := &sqliteHooks{}
	db, path := sqliteWithHooks(t, h, func(path string) string { return "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000" })
	other := openOption(t, "sqlite3", "file:"+path+"?_journal_mode=WAL&_busy_timeout=0", "SQLite", path)
	ctx := context.Background()
	if _, err := other.ExecContext(ctx, "CREATE TABLE other_writer (n INTEGER)"); err != nil {
		t.Fatal(err)
	}
	var commits, refused atomic.Int64
	interfere := func(int, bool, int) int {
		if _, err := other.ExecContext(ctx, "INSERT INTO other_writer VALUES (1)"); err != nil {
			refused.Add(1) // the store holds the write lock
		} else {
			commits.Add(1)
		}
		return sqlite3.SQLITE_OK
	}
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Batch: batch})
	h.table.Store(s.Table())
	h.onWrite.Store(&interfere)

	claim := func(keys ...string) *stores.Claim {
		t.Helper()
		c, err := s.Claim(ctx, "s", keys, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim %v: %v, %v", keys, c.Result, err)
		}
		return c
	}
	c := claim("a", "b")
	if err := s.Extend(ctx, c, 2*time.Minute); err != nil {
		t.Errorf("Extend of two keys: %v", err)
	}
	if err := s.Release(ctx, c); err != nil {
		t.Errorf("Release of two keys: %v", err)
	}
	c = claim("a", "b")
	if err := s.Complete(ctx, c, time.Minute, []byte("out")); err != nil {
		t.Errorf("Complete of two keys: %v", err)
	}
	c = claim("c")
	if err := s.Complete(ctx, c, time.Minute, nil); err != nil {
		t.Errorf("Complete of one key: %v", err)
	}
	if _, err := s.Delete(ctx, "s", "c", stores.StateDone); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if refused.Load() == 0 {
		t.Fatalf("the other writer was never held off (%d commits): the test did not interfere", commits.Load())
	}
}
