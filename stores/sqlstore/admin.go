package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The admin interface. The table keeps neither scope nor key, only their
// digest (RecordID): Get and Delete find a record by (scope, key), List
// lists records by ID (the digest as a UUID, in its order) and cannot
// select a scope or a key prefix, and Stats has no per-scope counts. The
// statements are built here from what each dialect tells of its columns
// (its adminSyntax).

var _ stores.Admin = (*Store)(nil)

// errNotByScope is the error of a List by scope or key.
var errNotByScope = fmt.Errorf("%w: records are stored under a digest of (scope, key) (RecordID), so they cannot be listed or counted by scope or key; Get finds one by its scope and key", stores.ErrNotSupported)

// adminColumns reads a record: id, state, expires_at in unix
// microseconds, token, data.
func (s *Store) adminColumns() string {
	a := s.d.adminSyntax()
	return fmt.Sprintf("%s, %s, %s, token, data", a.id, a.state, a.micros("expires_at"))
}

// Get implements [stores.Admin].
func (s *Store) Get(ctx context.Context, scope, key string) (stores.Record, error) {
	if err := s.checkCall(ctx, storekit.CheckRecordKey(key)); err != nil {
		return stores.Record{}, fmt.Errorf("sqlstore: get: %w", err)
	}
	rec, err := s.get(ctx, digest(scope, key), fmt.Sprintf("scope %q key %q", scope, key))
	if err != nil {
		return stores.Record{}, err
	}
	rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	return rec, nil
}

// GetByID implements [stores.Admin]: id is a RecordID as Record.ID shows
// it (a UUID), or in 32 hexadecimal digits.
func (s *Store) GetByID(ctx context.Context, id string) (stores.Record, error) {
	rid, err := parseRecordID(id)
	if err := s.checkCall(ctx, err); err != nil {
		return stores.Record{}, fmt.Errorf("sqlstore: get: %w", err)
	}
	return s.get(ctx, rid, "the record")
}

// get reads the record of id; what names it in errors.
func (s *Store) get(ctx context.Context, id recordID, what string) (stores.Record, error) {
	q := fmt.Sprintf("SELECT %s FROM %s WHERE id = %s", s.adminColumns(), s.q.table, s.q.ph(1))
	rec, err := s.readRecord(s.db.QueryRowContext(ctx, q, s.d.idArg(id)))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return stores.Record{}, fmt.Errorf("sqlstore: get: %w: %s (id %s)", stores.ErrNotFound, what, id.uuid())
	case err != nil:
		return stores.Record{}, fmt.Errorf("sqlstore: get: %w", s.classify(ctx, err))
	}
	return rec, nil
}

// Delete implements [stores.Admin]: in one short transaction, a locking
// read of the record, then its DELETE.
func (s *Store) Delete(ctx context.Context, scope, key string, want stores.RecordState) (stores.Record, error) {
	if err := s.checkCall(ctx, storekit.CheckRecordKey(key), storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("sqlstore: delete: %w", err)
	}
	rec, err := s.delete(ctx, digest(scope, key), want, fmt.Sprintf("scope %q key %q", scope, key))
	if rec.ID != "" {
		rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	}
	return rec, err
}

// DeleteByID implements [stores.Admin], as Delete does; id as in
// GetByID.
func (s *Store) DeleteByID(ctx context.Context, id string, want stores.RecordState) (stores.Record, error) {
	rid, err := parseRecordID(id)
	if err := s.checkCall(ctx, err, storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("sqlstore: delete: %w", err)
	}
	return s.delete(ctx, rid, want, "the record")
}

// delete deletes the record of id if it is in state want; what names it
// in errors.
func (s *Store) delete(ctx context.Context, id recordID, want stores.RecordState, what string) (stores.Record, error) {
	read := fmt.Sprintf("SELECT %s FROM %s WHERE id = %s%s", s.adminColumns(), s.q.table, s.q.ph(1), s.q.forUpdate)
	del := fmt.Sprintf("DELETE FROM %s WHERE id = %s", s.q.table, s.q.ph(1))
	var rec stores.Record
	err := s.retry(ctx, func() error {
		return s.inTx(ctx, func(tx *sql.Tx) error {
			if s.part != nil {
				if err := s.part.lockIDs(ctx, tx, []recordID{id}); err != nil {
					return err
				}
			}
			var err error
			if rec, err = s.readRecord(tx.QueryRowContext(ctx, read, s.d.idArg(id))); err != nil {
				return err
			}
			if rec.State != want {
				return stores.ErrWrongState
			}
			_, err = tx.ExecContext(ctx, del, s.d.idArg(id))
			return err
		})
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return stores.Record{}, fmt.Errorf("sqlstore: delete: %w: %s (id %s)", stores.ErrNotFound, what, id.uuid())
	case errors.Is(err, stores.ErrWrongState):
		return rec, fmt.Errorf("sqlstore: delete: %w: %s (id %s) is %s, not %s", stores.ErrWrongState, what, id.uuid(), rec.State, want)
	case err != nil:
		return stores.Record{}, fmt.Errorf("sqlstore: delete: %w", s.classify(ctx, err))
	}
	return rec, nil
}

// List implements [stores.Admin]: records in the order of their IDs, a
// range of the primary key after the cursor (the previous page's last
// ID). A Scope or KeyPrefix fails with [stores.ErrNotSupported].
func (s *Store) List(ctx context.Context, opts stores.ListOptions) ([]stores.Record, string, error) {
	opts, err := storekit.CheckListOptions(opts)
	var after recordID
	if err == nil && opts.After != "" {
		after, err = parseRecordID(opts.After)
	}
	if err := s.checkCall(ctx, err); err != nil {
		return nil, "", fmt.Errorf("sqlstore: list: %w", err)
	}
	if opts.Scope != "" || opts.KeyPrefix != "" {
		return nil, "", fmt.Errorf("sqlstore: list: %w", errNotByScope)
	}
	var (
		where []string
		args  []any
	)
	if opts.After != "" {
		args = append(args, s.d.idArg(after))
		where = append(where, "id > "+s.q.ph(len(args)))
	}
	if opts.State != 0 {
		where = append(where, fmt.Sprintf("%s = %d", s.d.adminSyntax().state, stateOf(opts.State)))
	}
	q := "SELECT " + s.adminColumns() + " FROM " + s.q.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, opts.Limit+1) // one more: is there a next page?
	q += " ORDER BY id LIMIT " + s.q.ph(len(args))
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("sqlstore: list: %w", s.classify(ctx, err))
	}
	defer rows.Close()
	var out []stores.Record
	for rows.Next() {
		rec, err := s.readRecord(rows)
		if err != nil {
			return nil, "", fmt.Errorf("sqlstore: list: %w", s.classify(ctx, err))
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("sqlstore: list: %w", s.classify(ctx, err))
	}
	var next string
	if len(out) > opts.Limit {
		out = out[:opts.Limit]
		next = out[len(out)-1].ID
	}
	return out, next, nil
}

// Stats implements [stores.Admin]: one aggregate over the whole table.
// Bytes is the size the database reports for the table and its indexes
// (PostgreSQL: pg_total_relation_size, with every partition; MySQL:
// information_schema's data and index length, an estimate; SQLite: the
// dbstat pages of the table and its index, -1 when the driver's SQLite
// has no dbstat).
func (s *Store) Stats(ctx context.Context) (stores.Stats, error) {
	if err := s.checkCall(ctx); err != nil {
		return stores.Stats{}, fmt.Errorf("sqlstore: stats: %w", err)
	}
	a := s.d.adminSyntax()
	q := fmt.Sprintf("SELECT %s, CASE WHEN expires_at > %s THEN 1 ELSE 0 END, COUNT(*), %s, %s FROM %s GROUP BY 1, 2",
		a.state, s.q.ph(1), a.micros("MIN(expires_at)"), a.micros("MAX(expires_at)"), s.q.table)
	rows, err := s.db.QueryContext(ctx, q, s.d.timeArg(s.now()))
	if err != nil {
		return stores.Stats{}, fmt.Errorf("sqlstore: stats: %w", s.classify(ctx, err))
	}
	defer rows.Close()
	st := stores.Stats{Bytes: -1}
	var (
		oldest, newest int64
		anyDone        bool
	)
	for rows.Next() {
		var state, live, n, lo, hi int64
		if err := rows.Scan(&state, &live, &n, &lo, &hi); err != nil {
			return stores.Stats{}, fmt.Errorf("sqlstore: stats: %w", s.classify(ctx, err))
		}
		switch {
		case live == 0:
			st.Expired += n
		case state == stateDone:
			st.Done += n
		default:
			st.Processing += n
		}
		if state == stateDone {
			if !anyDone || lo < oldest {
				oldest = lo
			}
			if !anyDone || hi > newest {
				newest = hi
			}
			anyDone = true
		}
	}
	if err := rows.Err(); err != nil {
		return stores.Stats{}, fmt.Errorf("sqlstore: stats: %w", s.classify(ctx, err))
	}
	if anyDone {
		st.OldestExpiry, st.NewestExpiry = time.UnixMicro(oldest), time.UnixMicro(newest)
	}
	if n, err := s.d.tableBytes(ctx, s.db); err == nil && n > 0 {
		st.Bytes = n
	}
	return st, nil
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// readRecord scans a row of adminColumns.
func (s *Store) readRecord(row scanner) (stores.Record, error) {
	var (
		idCol   []byte
		state   int64
		expires int64
		token   sql.NullInt64
		data    []byte
	)
	err := row.Scan(&idCol, &state, &expires, &token, &data)
	if err != nil {
		return stores.Record{}, err
	}
	var id recordID
	if len(idCol) == len(id) {
		copy(id[:], idCol) // MySQL, SQLite
	} else if id, err = parseRecordID(string(idCol)); err != nil { // PostgreSQL's uuid
		return stores.Record{}, fmt.Errorf("sqlstore: the id column holds %q, not a record ID", idCol)
	}
	at := time.UnixMicro(expires)
	rec := stores.Record{
		ID:      id.uuid(),
		Expired: !at.After(s.now()),
	}
	if state == stateDone {
		rec.State, rec.ExpiresAt = stores.StateDone, at
		if len(data) > 0 {
			rec.Data = data
		}
	} else {
		rec.State, rec.LeaseUntil = stores.StateProcessing, at
		rec.Token = strconv.FormatInt(token.Int64, 36)
		if len(data) > 0 {
			rec.Owner = data // a processing record keeps its owner as data
		}
	}
	return rec, nil
}

// parseRecordID reads a record ID in the UUID form Record.ID shows
// (PostgreSQL's id column, a List cursor), or as 32 hexadecimal digits.
func parseRecordID(s string) (recordID, error) {
	var id recordID
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 2*len(id) || (len(s) != len(h) && len(s) != 36) {
		return id, fmt.Errorf("%w: %q is not a record ID", stores.ErrInvalidArgument, s)
	}
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return id, fmt.Errorf("%w: %q is not a record ID", stores.ErrInvalidArgument, s)
	}
	return id, nil
}

func stateOf(st stores.RecordState) int {
	if st == stores.StateDone {
		return stateDone
	}
	return stateProcessing
}
