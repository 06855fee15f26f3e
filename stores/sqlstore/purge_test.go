package sqlstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestPurge fills a table with expired and live records, then purges in
// batches of 100 while claims go on: every expired record goes, no live
// one, no batch is larger than PurgeBatch, and claims are never blocked
// (sqltest.RunPurge; the batches seen through the package's purge hook).
func TestPurge(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		db := b.Open(t)
		clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		s := sqltest.NewStore(t, db, b.Dialect, sqlstore.Config{Clock: clock, PurgeBatch: 100, PurgeGrace: time.Minute})
		// PostgreSQL reads the heap in ranges of blocks: make them small,
		// so the purge walks many.
		sqlstore.SetPurgeChunk(s, 3)
		var batches, maxBatch atomic.Int64
		sqltest.RunPurge(t, s, clock, func() sqltest.PurgeBatches {
			sqlstore.SetPurgeHook(s, func(n int64) {
				batches.Add(1)
				for m := maxBatch.Load(); n > m && !maxBatch.CompareAndSwap(m, n); m = maxBatch.Load() {
				}
			})
			return func() (int64, int64) { return batches.Load(), maxBatch.Load() }
		})
	})
}
