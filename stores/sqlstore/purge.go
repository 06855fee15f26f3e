package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores/storekit"
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
//
// Purge implements [stores.Admin]'s Purge too.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return 0, fmt.Errorf("sqlstore: purge: %w", err)
	}
	if s.part != nil {
		return s.purgePartitions(ctx)
	}
	now := s.now()
	args := []any{s.d.timeArg(now), s.d.timeArg(now.Add(-s.grace())), s.cfg.PurgeBatch}
	stmt, ranges, err := s.d.purgePlan(ctx, s.db, s.purgeChunk)
	if err != nil {
		return 0, fmt.Errorf("sqlstore: purge of table %s: %w", s.cfg.Table, s.classify(ctx, err))
	}
	var total int64
	for r := range ranges {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		rargs := append(args[:3:3], r...)
		for {
			n, err := s.purgeStatement(ctx, stmt, rargs)
			total += n
			if err != nil {
				return total, err
			}
			if n < int64(s.cfg.PurgeBatch) {
				break // no more expired records in the range
			}
			if err := ctx.Err(); err != nil {
				return total, err
			}
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
		return s.inWriteTx(ctx, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("sqlstore: purge of table %s: %w", s.cfg.Table, s.classify(ctx, err))
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

// purgePartitions is Purge on the partitioned layout: it creates the
// partitions ahead, then drops every partition whose records have all
// expired: its day ended more than PurgeGrace (or the longest lease given)
// ago. It returns the dropped partitions' estimated row count.
func (s *Store) purgePartitions(ctx context.Context) (int64, error) {
	if err := s.createPartitions(ctx); err != nil {
		return 0, fmt.Errorf("sqlstore: creating partitions of table %s%s: %w", s.cfg.Table, ownerHint(err), s.classify(ctx, err))
	}
	n, err := s.part.dropPartitions(ctx, s.db, s.now().Add(-s.grace()), func(rows int64) {
		if s.onPurgeBatch != nil {
			s.onPurgeBatch(rows)
		}
	})
	if err != nil {
		return n, fmt.Errorf("sqlstore: purge of table %s%s: %w", s.cfg.Table, ownerHint(err), s.classify(ctx, err))
	}
	return n, nil
}

// ownerHint explains a refused partition DDL (SQLSTATE 42501,
// insufficient privilege: "must be owner of table", "permission denied
// for schema"): the partitioned layout's purge creates and drops
// partitions, which needs a role that owns the table. Run the purge job
// as that role, and set PurgeJobElsewhere on the stores of roles that
// may only read and write the table (README.md, "Least privilege").
func ownerHint(err error) string {
	if code, _ := sqlState(err); code == "42501" {
		return " (creating and dropping partitions needs a role that owns the table; see PurgeJobElsewhere)"
	}
	return ""
}
