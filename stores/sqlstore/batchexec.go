package sqlstore

import (
	"context"
	"database/sql"
	"time"
)

// The portable batch executor, which SQLite and PostgreSQL without pgx
// run, and the single-row statement of each op, which PostgreSQL's
// pipeline sends too.

// opStatement is the single-row statement that runs o on its own (the
// statement an unbatched call runs first), and its arguments.
func opStatement(d dialect, o *op, now time.Time) (string, []any) {
	q := d.sql()
	id := d.idArg(o.id())
	switch o.kind {
	case opClaim:
		return q.insertProcessing, []any{id, o.token, d.timeArg(now.Add(o.d)), nil}
	case opComplete:
		return q.complete(1), []any{d.timeArg(now.Add(o.d)), dataArg(o.data), o.token, id}
	case opRelease:
		return q.release(1), []any{o.token, id}
	default:
		return q.extend(1), []any{d.timeArg(now.Add(o.d)), o.token, id}
	}
}

// execInTx is the portable batch executor: one transaction of the calls'
// own single-row statements, after prelude (transaction settings) when
// not empty, so one commit for the batch. A claim that finds a record
// reads it locked in the same transaction and takes an expired one over
// there.
func execInTx(ctx context.Context, db *sql.DB, d dialect, ops []*op, now time.Time, prelude string) error {
	return inTx(ctx, db, d.quirks().txOptions, func(tx *sql.Tx) error {
		if prelude != "" {
			if _, err := tx.ExecContext(ctx, prelude); err != nil {
				return err
			}
		}
		for _, o := range ops {
			stmt, args := opStatement(d, o, now)
			res, err := tx.ExecContext(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			if !applied(o, n) {
				continue
			}
			recs, err := fetch(ctx, tx, d, o.ks.ids, now, true)
			if err != nil {
				return err
			}
			r, ok := recs[idKey(d, o.id())]
			if err := claimLocked(ctx, tx, d, o, r, ok, now); err != nil {
				return err
			}
		}
		return nil
	})
}
