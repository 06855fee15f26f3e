package sqlstore_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// BenchmarkPostgresRecordSize fills a table with done records through the
// store and reports pg_total_relation_size (heap, primary key and BRIN
// index, TOAST) per record, before and after VACUUM. It runs once per
// mode whatever b.N; DEDUP_RECORDS sets the count (default 1,000,000).
//
//	go test -run '^$' -bench BenchmarkPostgresRecordSize -benchtime 1x -timeout 30m ./stores/sqlstore/
func BenchmarkPostgresRecordSize(b *testing.B) {
	records := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("DEDUP_RECORDS")); err == nil && v > 0 {
		records = v
	}
	db := sqltest.OpenPostgres(b)
	for _, mode := range []string{"tx", "lease"} {
		b.Run(mode, func(b *testing.B) {
			s := sqltest.NewStore(b, db, sqlstore.Postgres, sqlstore.Config{})
			prefix := "k-" + storetest.NewID() + "-"
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(records) {
							return
						}
						key := prefix + strconv.FormatInt(i, 10)
						if mode == "tx" {
							tx, err := s.Begin(ctx, "size", []string{key}, time.Hour)
							if err == nil {
								err = tx.Commit(ctx, nil)
							}
							if err != nil {
								b.Error(err)
								return
							}
							continue
						}
						c, err := s.Claim(ctx, "size", []string{key}, time.Minute)
						if err == nil {
							err = s.Complete(ctx, c, time.Hour, nil)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			fill := time.Since(start)
			size := func() (total, heap, idx int64) {
				q := `SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass), pg_indexes_size($1::regclass)`
				if err := db.QueryRowContext(ctx, q, s.Table()).Scan(&total, &heap, &idx); err != nil {
					b.Fatal(err)
				}
				return
			}
			total, heap, idx := size()
			if _, err := db.ExecContext(ctx, "VACUUM "+s.Table()); err != nil {
				b.Fatal(err)
			}
			vtotal, vheap, vidx := size()
			n := float64(records)
			b.ReportMetric(float64(total)/n, "B/record")
			b.ReportMetric(float64(vtotal)/n, "B/record-vacuumed")
			b.Logf("%s: %d records in %s (%.0f msgs/s): total %d B (heap %d, indexes %d) = %.1f B/record; after VACUUM %d B (heap %d, indexes %d) = %.1f B/record",
				mode, records, fill.Round(time.Millisecond), n/fill.Seconds(), total, heap, idx, float64(total)/n, vtotal, vheap, vidx, float64(vtotal)/n)
		})
	}
}
