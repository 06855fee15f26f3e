package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// BenchmarkSQLStore measures messages per second through the store, every
// message new: lease mode is Claim + Complete (two statements), tx mode is
// Begin + Commit (BEGIN, INSERT, COMMIT) with no handler writes, each at 1
// and 16 concurrent callers. It reports; it asserts nothing.
//
//	go test -run '^$' -bench BenchmarkSQLStore ./stores/sqlstore/
func BenchmarkSQLStore(b *testing.B) {
	for _, be := range backends {
		b.Run(string(be.Dialect), func(b *testing.B) {
			db := be.Open(b)
			s := sqltest.NewStore(b, db, be.Dialect, sqlstore.Config{})
			ops := map[string]func(ctx context.Context, key string) error{
				"lease": storetest.ClaimComplete(s, "bench"),
				"tx": func(ctx context.Context, key string) error {
					tx, err := s.Begin(ctx, "bench", []string{key}, time.Hour)
					if err != nil {
						return err
					}
					if tx.Result() != stores.Claimed {
						return fmt.Errorf("begin of a new key: %s", tx.Result())
					}
					return tx.Commit(ctx, nil)
				},
			}
			for _, mode := range []string{"lease", "tx"} {
				for _, workers := range []int{1, 16} {
					b.Run(fmt.Sprintf("%s/conc=%d", mode, workers), func(b *testing.B) {
						storetest.RunParallel(b, workers, ops[mode])
					})
				}
			}
		})
	}
}
