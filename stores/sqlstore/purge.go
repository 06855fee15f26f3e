package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
)

// Purge deletes expired records now, in statements of at most
// Config.PurgeBatch rows, each its own short transaction so claims go on
// in between, until a batch comes back short. It returns how many records
// it deleted. Done records go once their retention ends; processing
// records once their lease ended more than Config.PurgeGrace ago, or more
// than the longest lease this store has given, if longer (the Store
// contract keeps an expired claim its owner's for one more lease).
//
// Purging is for space only: an expired record is never treated as live,
// purged or not. Several processes may purge the same table at once.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("sqlstore: purge: %w", stores.ErrClosed)
	}
	if s.q.partitioned {
		return s.purgePartitions(ctx)
	}
	now := s.now()
	args := []any{s.q.timeArg(now), s.q.timeArg(now.Add(-s.grace())), s.cfg.PurgeBatch}
	if s.cfg.Dialect == Postgres {
		var blocks int64
		var version int
		if err := s.db.QueryRowContext(ctx, heapBlocks, s.q.table).Scan(&blocks, &version); err != nil {
			return 0, fmt.Errorf("sqlstore: purge of table %s: %w", s.cfg.Table, err)
		}
		if version >= 140000 {
			return s.purgeBlocks(ctx, args, blocks)
		}
		// Before PostgreSQL 14 a ctid range is no scan bound: purge with
		// one statement per batch (it scans from the start of the table,
		// or uses an index on expires_at if the table has one).
	}
	stmt := s.q.purge()
	var total int64
	for {
		n, err := s.purgeStatement(ctx, stmt, args)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(s.cfg.PurgeBatch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// grace is how long after its lease ended the purge keeps a processing
// record: PurgeGrace, or the longest lease this store has given if
// longer.
func (s *Store) grace() time.Duration {
	return max(s.cfg.PurgeGrace, time.Duration(s.maxLease.Load()))
}

// noteLease raises maxLease to lease.
func (s *Store) noteLease(lease time.Duration) {
	for {
		m := s.maxLease.Load()
		if int64(lease) <= m || s.maxLease.CompareAndSwap(m, int64(lease)) {
			return
		}
	}
}

// purgeChunkBlocks is the number of heap blocks (8 kB each by default,
// about 100 records) one purge statement reads on PostgreSQL.
const purgeChunkBlocks = 1024

// purgeBlocks is Purge on PostgreSQL 14 and later: it walks the heap once,
// from its first block to the last one it had when the purge started, in
// ranges of purgeChunkBlocks blocks, deleting at most PurgeBatch records
// per statement (a range with more expired records is read again). Each
// statement reads at most one range, and a purge reads the table once:
// the cost of dropping the index on expires_at that made every Complete a
// non-HOT update.
func (s *Store) purgeBlocks(ctx context.Context, args []any, blocks int64) (int64, error) {
	stmt := s.q.purgeBlocks()
	var total int64
	for from := int64(0); from < blocks; {
		to := from + s.purgeChunk
		n, err := s.purgeStatement(ctx, stmt, append(args[:3:3], fmt.Sprintf("(%d,0)", from), fmt.Sprintf("(%d,0)", to)))
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(s.cfg.PurgeBatch) {
			from = to
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
	return total, nil
}

// purgeStatement runs one purge statement in a short transaction of its
// own and returns how many records it deleted.
func (s *Store) purgeStatement(ctx context.Context, stmt string, args []any) (int64, error) {
	var n int64
	err := s.retry(ctx, func() error {
		// READ COMMITTED: no gap locks on MySQL, so inserts of new
		// records are never blocked by a purge.
		return s.inTx(ctx, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("sqlstore: purge of table %s: %w", s.cfg.Table, err)
	}
	if s.onPurgeBatch != nil {
		s.onPurgeBatch(n)
	}
	return n, nil
}

// purgeRetry is how soon the purge job runs again after a failed run, when
// PurgeInterval is longer: on the partitioned layout a run that failed may
// have left tomorrow's last partition uncreated.
const purgeRetry = time.Minute

func (s *Store) purgeLoop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTimer(s.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			next := s.cfg.PurgeInterval
			n, err := s.Purge(ctx)
			if err != nil && ctx.Err() == nil {
				s.cfg.Logger.Error("sqlstore: purge failed", err, watermill.LogFields{"table": s.cfg.Table, "deleted": n})
				next = min(next, purgeRetry)
			} else if n > 0 {
				s.cfg.Logger.Debug("sqlstore: purged expired records", watermill.LogFields{"table": s.cfg.Table, "deleted": n})
			}
			t.Reset(next)
		}
	}
}

// partitionLockTimeout bounds how long creating or dropping a partition
// waits for its lock on the parent table. Both take a lock that queues
// every claim and Begin behind them, and they wait for any long
// transaction on the table (an open inbox transaction, a slow report):
// give up soon instead, and try again at the next run (within a minute
// after a failed one).
const partitionLockTimeout = "500ms"

// partition is one of the table's partitions.
type partition struct {
	name string
	day  time.Time // the UTC day of expires_at it holds
	rows int64     // estimated (pg_class.reltuples)
}

// partitions lists the table's partitions that this store names.
func (s *Store) partitions(ctx context.Context) (map[string]partition, error) {
	rows, err := s.db.QueryContext(ctx, listPartitions, s.q.table)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: listing partitions of table %s: %w", s.cfg.Table, err)
	}
	defer rows.Close()
	parts := map[string]partition{}
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.rows); err != nil {
			return nil, err
		}
		suffix, ok := strings.CutPrefix(p.name, s.q.name)
		if !ok {
			continue
		}
		if p.day, err = time.Parse(partitionSuffix, suffix); err != nil {
			continue // not one of ours
		}
		parts[p.name] = p
	}
	return parts, rows.Err()
}

// partitionDDL runs a statement that locks the parent table (creating or
// dropping a partition) under partitionLockTimeout.
func (s *Store) partitionDDL(ctx context.Context, stmt string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '"+partitionLockTimeout+"'"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, stmt)
		return err
	})
}

// createPartitions creates the partitions from yesterday to
// PartitionDaysAhead+1 days ahead (UTC days) that do not exist yet. The
// extra day is for the records written after the next UTC midnight,
// before the purge job runs again (at most a day later: PurgeInterval is
// at most a day): one with a lease or retention of PartitionDaysAhead
// days then expires on the day after today+PartitionDaysAhead. Only a
// missing partition takes the lock on the parent table.
func (s *Store) createPartitions(ctx context.Context) error {
	parts, err := s.partitions(ctx)
	if err != nil {
		return err
	}
	today := s.now().UTC().Truncate(24 * time.Hour)
	for d := -1; d <= s.cfg.PartitionDaysAhead+1; d++ {
		day := today.AddDate(0, 0, d)
		if _, ok := parts[s.q.partitionName(day)]; ok {
			continue
		}
		if err := s.partitionDDL(ctx, s.q.createPartition(day)); err != nil {
			// Another process creating the same partition at the same
			// moment: IF NOT EXISTS is not race-free in PostgreSQL.
			var pg interface{ SQLState() string }
			if errors.As(err, &pg) && (pg.SQLState() == "42P07" || pg.SQLState() == "23505") {
				continue
			}
			return err
		}
	}
	return nil
}

// purgePartitions is Purge on the partitioned layout: it creates the
// partitions ahead, then drops every partition whose records have all
// expired: its day ended more than PurgeGrace (or the longest lease given)
// ago. It returns the dropped partitions' estimated row count.
func (s *Store) purgePartitions(ctx context.Context) (int64, error) {
	if err := s.createPartitions(ctx); err != nil {
		return 0, fmt.Errorf("sqlstore: creating partitions of table %s: %w", s.cfg.Table, err)
	}
	parts, err := s.partitions(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := s.now().Add(-s.grace())
	var total int64
	for _, p := range parts {
		if p.day.Add(24 * time.Hour).After(cutoff) {
			continue
		}
		if err := s.partitionDDL(ctx, "DROP TABLE IF EXISTS "+s.q.qualified(p.name)); err != nil {
			return total, fmt.Errorf("sqlstore: dropping partition %s: %w", p.name, err)
		}
		total += p.rows
		if s.onPurgeBatch != nil {
			s.onPurgeBatch(p.rows)
		}
	}
	return total, nil
}
