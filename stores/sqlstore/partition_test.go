package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func partitionedConfig(clock stores.Clock) sqlstore.Config {
	return sqlstore.Config{Clock: clock, DailyPartitions: true, PurgeInterval: time.Hour}
}

// partitionedAt returns a store over db with daily partitions, daysAhead
// of them ahead, created at start on the fake clock it returns.
func partitionedAt(t *testing.T, db *sql.DB, start time.Time, daysAhead int) (*sqlstore.Store, *storetest.FakeClock) {
	t.Helper()
	clock := storetest.NewFakeClock(start)
	cfg := partitionedConfig(clock)
	cfg.PartitionDaysAhead = daysAhead
	return sqltest.NewStore(t, db, sqlstore.Postgres, cfg), clock
}

func TestPartitionedConformance(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
		return sqltest.NewStore(t, db, sqlstore.Postgres, partitionedConfig(clock))
	}, storetest.AdminNoScopes())
}

func TestPartitionedInboxLedger(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s := sqltest.NewStore(t, db, sqlstore.Postgres, partitionedConfig(nil))
	sqltest.RunLedger(t, db, sqlstore.Postgres, s, sqltest.NewLedger(t, db, sqlstore.Postgres, 16))
}

// TestPartitionedPurge: the purge drops the partitions whose records all
// expired and creates new ones ahead; live records stay.
func TestPartitionedPurge(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s, clock := partitionedAt(t, db, time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC), 3)
	ctx := context.Background()
	begin := func(key string, retention time.Duration) {
		t.Helper()
		tx, err := s.Begin(ctx, "p", []string{key}, retention)
		if err != nil || tx.Result() != stores.Claimed {
			t.Fatalf("Begin(%s): %v %v", key, tx, err)
		}
		if err := tx.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		begin("short-"+storetest.NewID(), time.Hour) // expire 2030-01-01
	}
	begin("long", 3*24*time.Hour) // expires 2030-01-04
	if _, err := s.Begin(ctx, "p", []string{"too-long"}, 4*24*time.Hour); !errors.Is(err, stores.ErrInvalidArgument) {
		t.Fatalf("retention beyond the partitions: %v, want ErrInvalidArgument", err)
	}
	clock.Advance(24 * time.Hour) // 2030-01-02 12:00: the 2030-01-01 partition ended 12h ago
	n, err := s.Purge(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := sqltest.CountRows(t, db, sqlstore.Postgres, s.Table()); got != 1 {
		t.Fatalf("%d records after the purge (estimate %d dropped), want 1", got, n)
	}
	var parts []string
	rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass ORDER BY 1`, s.Table())
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p string
		_ = rows.Scan(&p)
		parts = append(parts, p)
	}
	rows.Close()
	// 2029-12-31 and 2030-01-01 ended more than PurgeGrace ago: dropped;
	// 2030-01-06 (3+1 days ahead of 2030-01-02) was created.
	if len(parts) == 0 || parts[0] != s.Table()+"_p20300102" || parts[len(parts)-1] != s.Table()+"_p20300106" {
		t.Fatalf("partitions after purge: %v", parts)
	}
	tx, err := s.Begin(ctx, "p", []string{"long"}, time.Hour)
	if err != nil || tx.Result() != stores.Duplicate {
		t.Fatalf("the live record after the purge: %v %v", tx, err)
	}
}

// TestPartitionedRefusesRepeatableRead: Begin must not join a REPEATABLE
// READ transaction on the partitioned layout.
func TestPartitionedRefusesRepeatableRead(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s := sqltest.NewStore(t, db, sqlstore.Postgres, partitionedConfig(nil))
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := s.Begin(sqlstore.WithTx(ctx, tx), "rr", []string{"k"}, time.Hour); !errors.Is(err, stores.ErrInvalidArgument) {
		t.Fatalf("Begin in a REPEATABLE READ transaction = %v, want ErrInvalidArgument", err)
	}
}

// TestPartitionsAfterMidnight: a lease or retention of PartitionDaysAhead
// days must fit in a partition at any time of day, not only until the
// first UTC midnight after the purge job last ran: from midnight on, such
// a record expires on the day after the last partition that job created.
func TestPartitionsAfterMidnight(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s, clock := partitionedAt(t, db, time.Date(2030, 1, 1, 23, 59, 0, 0, time.UTC), 3) // CreateSchema at 23:59
	ctx := context.Background()
	clock.Advance(2 * time.Minute) // 00:01 the next day; the purge job has not run
	horizon := 3 * 24 * time.Hour
	c, err := s.Claim(ctx, "p", []string{"lease"}, horizon)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim with a lease of PartitionDaysAhead after midnight = %+v, %v", c, err)
	}
	if err := s.Complete(ctx, c, horizon, nil); err != nil {
		t.Fatalf("Complete with a retention of PartitionDaysAhead after midnight: %v", err)
	}
	tx, err := s.Begin(ctx, "p", []string{"inbox"}, horizon)
	if err != nil || tx.Result() != stores.Claimed {
		t.Fatalf("Begin with a retention of PartitionDaysAhead after midnight = %v, %v", tx, err)
	}
	if err := tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// TestPartitionedPurgeIdleAllDay: a purge run that finds nothing to do
// takes no lock on the table, at any time of day, not only in the first
// PurgeGrace after midnight: it does not create yesterday's partition
// when it would drop it at once (its day ended more than PurgeGrace
// ago), as each hourly run did, locking the table twice.
func TestPartitionedPurgeIdleAllDay(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	s, clock := partitionedAt(t, db, time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC), 2)
	ctx := context.Background()
	if _, err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour) // the next hourly run
	holdRead(t, db, s)
	if err := purgeBeside(t, s, "an hourly Purge with nothing to do"); err != nil {
		t.Fatalf("an hourly Purge with nothing to create or drop: %v (it took a lock the long transaction holds)", err)
	}
}

// holdRead opens a transaction that reads s's table and stays open until
// t ends: creating or dropping a partition waits for its lock.
func holdRead(t *testing.T, db *sql.DB, s *sqlstore.Store) {
	t.Helper()
	long, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = long.Rollback() }) // before the table is dropped
	var n int
	if err := long.QueryRowContext(context.Background(), `SELECT count(*) FROM "`+s.Table()+`"`).Scan(&n); err != nil {
		t.Fatal(err)
	}
}

// purgeBeside runs s.Purge beside holdRead's transaction and returns its
// error. A purge that needs the lock gives up after its 500ms
// lock_timeout; one still waiting after a minute fails t: every claim
// would queue behind it.
func purgeBeside(t *testing.T, s *sqlstore.Store, what string) error {
	t.Helper()
	purged := make(chan error, 1)
	go func() { _, err := s.Purge(context.Background()); purged <- err }()
	select {
	case err := <-purged:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s still waiting for the long transaction after a minute: every claim queues behind it", what)
		return nil
	}
}

// TestPartitionedPurgeIntervalBound: the purge job must run at least once
// a day to keep a partition ahead of every record.
func TestPartitionedPurgeIntervalBound(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Hour, 24*time.Hour + time.Nanosecond, 7 * 24 * time.Hour} {
		cfg := sqlstore.Config{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeInterval: d}
		if err := cfg.Validate(); err == nil {
			t.Errorf("Validate with DailyPartitions and PurgeInterval %s = nil, want an error", d)
		}
	}
	cfg := sqlstore.Config{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeInterval: 24 * time.Hour}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate with a daily purge: %v", err)
	}

	// Or the job runs in another process (as the table's owner).
	cfg = sqlstore.Config{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeJobElsewhere: true}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate with PurgeJobElsewhere: %v", err)
	}
	for _, bad := range []sqlstore.Config{
		{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeJobElsewhere: true, PurgeInterval: time.Hour},
		{Dialect: sqlstore.Postgres, PurgeJobElsewhere: true},
	} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "PurgeJobElsewhere") {
			t.Errorf("Validate(%+v) = %v, want an error naming PurgeJobElsewhere", bad, err)
		}
	}
}

// TestPartitionDDLWaitsBounded: creating tomorrow's partition locks the
// parent table, so it waits for any long transaction on the table (here
// an open read), and every claim queues behind it. The purge gives up
// after a short lock timeout instead (and its job retries soon); only a
// missing partition is created, so the hourly runs take no such lock.
func TestPartitionDDLWaitsBounded(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	// Five minutes into the day: yesterday's partition ended less than
	// PurgeGrace ago, so nothing is due to be dropped either.
	s, clock := partitionedAt(t, db, time.Date(2030, 1, 1, 0, 5, 0, 0, time.UTC), 2)
	ctx := context.Background()
	holdRead(t, db, s)
	// Nothing is missing, nothing is due: the purge takes no lock.
	if err := purgeBeside(t, s, "Purge with every partition there"); err != nil {
		t.Fatalf("Purge with every partition there: %v", err)
	}
	clock.Advance(24 * time.Hour) // a partition is missing now
	if err := purgeBeside(t, s, "Purge"); err == nil {
		t.Fatal("Purge created a partition under a lock the long transaction holds")
	}
	// Claims go on: nothing of the purge waits in the lock queue.
	cctx, cancel := context.WithTimeout(ctx, time.Minute) // behind a queued lock it would wait until the test ends
	defer cancel()
	if c, err := s.Claim(cctx, "p", []string{"k"}, time.Minute); err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim after the purge gave up = %+v, %v", c, err)
	}
}
