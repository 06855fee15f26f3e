package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestSQLiteBusyRetried: a call that finds the SQLite database locked by
// another writer (SQLITE_BUSY, here at once: no busy timeout) is retried
// until the lock is free, with either driver. mattn/go-sqlite3 reports
// the code in a struct field, modernc.org/sqlite through a method.
func TestSQLiteBusyRetried(t *testing.T) {
	for _, driver := range []string{"sqlite", "sqlite3"} {
		t.Run(driver, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "busy.db")
			dsn := "file:" + path + "?_busy_timeout=0&_journal_mode=WAL"
			if driver == "sqlite" {
				dsn = "file:" + path + "?_pragma=busy_timeout(0)&_pragma=journal_mode(WAL)"
			}
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{Batch: sqlstore.BatchConfig{Disabled: true}})
			ctx := context.Background()
			// Another writer holds the database's write lock for 100ms.
			locker, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close()
			if _, err := locker.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(100 * time.Millisecond)
				_, _ = locker.ExecContext(ctx, "COMMIT")
			}()
			c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
			<-released
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("Claim while another writer held the lock for 100ms = %+v, %v; want Claimed after retries", c, err)
			}
		})
	}
}

// TestDurationsRoundUpAndSaturate: the store keeps time to the
// microsecond and rounds a lease or retention up to it, never down to
// nothing; math.MaxInt64 is "about 292 years", not an overflow.
func TestDurationsRoundUpAndSaturate(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		for _, batched := range []bool{true, false} {
			t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
				clock := storetest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC))
				s := sqltest.NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{Disabled: !batched}})
				ctx := context.Background()
				c, err := s.Claim(ctx, "s", []string{"tiny"}, time.Nanosecond)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(1ns) = %+v, %v", c, err)
				}
				if again, err := s.Claim(ctx, "s", []string{"tiny"}, time.Minute); err != nil || again.Result != stores.InProgress {
					t.Fatalf("Claim before the clock moved, of a 1ns lease = %+v, %v; want InProgress (rounded up to 1µs)", again, err)
				}
				clock.Advance(time.Microsecond)
				if again, err := s.Claim(ctx, "s", []string{"tiny"}, time.Minute); err != nil || again.Result != stores.Claimed || !again.Takeover {
					t.Fatalf("Claim 1µs later = %+v, %v; want a takeover", again, err)
				}
				for _, keys := range [][]string{{"huge"}, {"h1", "h2"}} {
					c, err := s.Claim(ctx, "s", keys, math.MaxInt64)
					if err != nil || c.Result != stores.Claimed {
						t.Fatalf("Claim(%q, MaxInt64) = %+v, %v", keys, c, err)
					}
					if err := s.Extend(ctx, c, math.MaxInt64); err != nil {
						t.Fatalf("Extend(MaxInt64): %v", err)
					}
					clock.Advance(100 * 365 * 24 * time.Hour)
					if again, err := s.Claim(ctx, "s", keys, time.Minute); err != nil || again.Result != stores.InProgress {
						t.Fatalf("Claim a century into a MaxInt64 lease = %+v, %v; want InProgress", again, err)
					}
					if err := s.Complete(ctx, c, math.MaxInt64, []byte("x")); err != nil {
						t.Fatalf("Complete(MaxInt64): %v", err)
					}
					if dup, err := s.Claim(ctx, "s", keys, time.Minute); err != nil || dup.Result != stores.Duplicate {
						t.Fatalf("Claim after Complete(MaxInt64) = %+v, %v; want Duplicate", dup, err)
					}
				}
				tx, err := s.Begin(ctx, "s", []string{"inbox-huge"}, math.MaxInt64)
				if err != nil || tx.Result() != stores.Claimed {
					t.Fatalf("Begin(MaxInt64) = %v, %v", tx, err)
				}
				if err := tx.Commit(ctx, []byte("y")); err != nil {
					t.Fatalf("Commit of a MaxInt64 retention: %v", err)
				}
			})
		}
	})
}

// TestCallerContextIsNotAnOutage: a call whose context is already done
// fails with that context's error, which is not the outage class: the
// caller gave up, the database did not fail.
func TestCallerContextIsNotAnOutage(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		s := sqltest.NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{})
		expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		cancelled, cancel2 := context.WithCancel(context.Background())
		cancel2()
		for name, ctx := range map[string]context.Context{"expired": expired, "cancelled": cancelled} {
			_, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
			if !errors.Is(err, ctx.Err()) || errors.Is(err, stores.ErrUnavailable) {
				t.Errorf("Claim with a context %s = %v; want its error, not an outage", name, err)
			}
			_, err = s.Begin(ctx, "s", []string{"k"}, time.Minute)
			if !errors.Is(err, ctx.Err()) || errors.Is(err, stores.ErrUnavailable) {
				t.Errorf("Begin with a context %s = %v; want its error, not an outage", name, err)
			}
		}
	})
}
