package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Records as the generic code reads them (selectRows): the row, its
// fetching and scanning, keyed by idKey; the query arguments of ids and
// data; and the short transaction they are read and written in.

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// record is one row as selectRows reads it.
type record struct {
	state int
	live  bool
	data  []byte
	token int64 // 0 when NULL (a done record)
}

// fetch reads the records of ids, keyed by idKey.
func fetch(ctx context.Context, db querier, d dialect, ids []recordID, now time.Time, lock bool) (map[string]record, error) {
	rows, err := db.QueryContext(ctx, d.sql().selectRows(len(ids), lock), idArgs(d, []any{d.timeArg(now)}, ids)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanRecords(rows)
}

// rowScanner is what scanRecords needs of *sql.Rows or pgx.Rows.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanRecords reads the rows of a selectRows query, keyed by idKey.
func scanRecords(rows rowScanner) (map[string]record, error) {
	out := make(map[string]record)
	for rows.Next() {
		var (
			id    string
			r     record
			live  int
			token sql.NullInt64
		)
		if err := rows.Scan(&id, &r.state, &live, &r.data, &token); err != nil {
			return nil, err
		}
		r.live, r.token = live == 1, token.Int64
		out[id] = r
	}
	return out, rows.Err()
}

// idArgs returns prefix followed by the query arguments of ids.
func idArgs(d dialect, prefix []any, ids []recordID) []any {
	args := make([]any, 0, len(prefix)+len(ids))
	args = append(args, prefix...)
	for _, id := range ids {
		args = append(args, d.idArg(id))
	}
	return args
}

// idKey is what a read of records returns in its id column for id, as a
// string: the id's query argument, which is what the column holds.
func idKey(d dialect, id recordID) string {
	switch a := d.idArg(id).(type) {
	case string:
		return a
	case []byte:
		return string(a)
	default:
		panic(fmt.Sprintf("sqlstore: id argument of type %T", a))
	}
}

// errRollback rolls a transaction back without failing the operation.
var errRollback = errors.New("sqlstore: roll back")

// inTx runs fn in a short transaction on db: commit when fn returns nil,
// rollback otherwise (errRollback: rollback, no error).
func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		if errors.Is(err, errRollback) {
			return nil
		}
		return err
	}
	return tx.Commit()
}

// dataArg stores empty data as NULL.
func dataArg(data []byte) any {
	if len(data) == 0 {
		return nil
	}
	return data
}
