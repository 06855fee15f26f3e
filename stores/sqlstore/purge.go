package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
)

// Purge deletes expired records now, in statements of at most
// Config.PurgeBatch rows, each its own short transaction so claims go on
// in between, until a batch comes back short. It returns how many records
// it deleted. Done records go once their retention ends; processing
// records once their lease ended more than Config.PurgeGrace ago.
//
// Purging is for space only: an expired record is never treated as live,
// purged or not. Several processes may purge the same table at once.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("sqlstore: Purge: %w", stores.ErrClosed)
	}
	now := s.now()
	args := []any{s.q.timeArg(now), s.q.timeArg(now.Add(-s.cfg.PurgeGrace)), s.cfg.PurgeBatch}
	stmt := s.q.purge()
	var total int64
	for {
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
			return total, fmt.Errorf("sqlstore: purge of table %s: %w", s.cfg.Table, err)
		}
		total += n
		if s.onPurgeBatch != nil {
			s.onPurgeBatch(n)
		}
		if n < int64(s.cfg.PurgeBatch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

func (s *Store) purgeLoop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := s.Purge(ctx)
			if err != nil && ctx.Err() == nil {
				s.cfg.Logger.Error("sqlstore: purge failed", err, watermill.LogFields{"table": s.cfg.Table, "deleted": n})
			} else if n > 0 {
				s.cfg.Logger.Debug("sqlstore: purged expired records", watermill.LogFields{"table": s.cfg.Table, "deleted": n})
			}
		}
	}
}
