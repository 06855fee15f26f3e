package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestConnectionCut cuts every database connection mid-stream through a
// test-owned TCP proxy, then restores it: no effect lost, none doubled
// (an ambiguous COMMIT is resolved by the redelivery finding the record),
// and the store works again after Restore.
func TestConnectionCut(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		direct := b.Open(t)
		s, _, p := proxiedStore(t, b, sqlstore.Config{})
		table := s.Table()
		l := sqltest.NewLedger(t, direct, b.Dialect, 8)

		var cutOnce, restoreOnce sync.Once
		restored := make(chan struct{})
		r := sqltest.LedgerRun{Events: 600, MaxCopies: 2, Workers: 16, Deadline: 5 * time.Minute, Faults: true,
			AfterAck: func(n int64) {
				if n == 150 {
					cutOnce.Do(func() {
						p.Cut()
						time.AfterFunc(300*time.Millisecond, func() {
							restoreOnce.Do(func() { p.Restore(); close(restored) })
						})
					})
				}
			}}
		want, st := r.Run(t, s, l)
		<-restored
		if got := l.Sum(t, direct); got != want {
			t.Errorf("ledger sum = %d, want %d (an effect was lost or doubled)", got, want)
		}
		if got := sqltest.CountRows(t, direct, b.Dialect, table); got != r.Events {
			t.Errorf("inbox rows = %d, want %d", got, r.Events)
		}
		if st.StoreErrors.Load() == 0 {
			t.Error("the cut caused no store error: the proxy did not cut anything")
		}
		// The lease mode recovers too.
		c, err := s.Claim(context.Background(), "after-cut", []string{"k"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim after Restore: %v, %v", c, err)
		}
		t.Logf("%s: %d store errors during the cut, all retried", b.Dialect, st.StoreErrors.Load())
	})
}
