package memstore

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The admin interface. A record holds no scope and no key (see Keys in
// the package doc), only their hash: Get and Delete find a record by
// (scope, key), List lists records by ID (the hash, 32 hexadecimal
// digits, in the store's own order, valid for this process only) and
// cannot select a scope or a key prefix, and Stats has no per-scope
// counts.

var _ stores.Admin = (*Store)(nil)

// Get implements [stores.Admin].
func (s *Store) Get(ctx context.Context, scope, key string) (stores.Record, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckRecordKey(key)); err != nil {
		return stores.Record{}, fmt.Errorf("memstore: get: %w", err)
	}
	return s.get(s.hash(scope, key), scope, key)
}

// GetByID implements [stores.Admin].
func (s *Store) GetByID(ctx context.Context, id string) (stores.Record, error) {
	h, err := parseID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return stores.Record{}, fmt.Errorf("memstore: get: %w", err)
	}
	return s.get(h, "", "")
}

// get returns the record of h; scope and key are the caller's, when
// known.
func (s *Store) get(h hkey, scope, key string) (stores.Record, error) {
	sh := s.shard(h)
	sh.mu.Lock()
	r, ok := sh.recs.get(h)
	data := sh.data[h]
	sh.mu.Unlock()
	if !ok {
		return stores.Record{}, fmt.Errorf("memstore: get: %w: %s", stores.ErrNotFound, describe(h, scope, key))
	}
	return s.record(h, r, data, s.now(), scope, key), nil
}

// Delete implements [stores.Admin].
func (s *Store) Delete(ctx context.Context, scope, key string, want stores.RecordState) (stores.Record, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckRecordKey(key), storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("memstore: delete: %w", err)
	}
	return s.delete(s.hash(scope, key), scope, key, want)
}

// DeleteByID implements [stores.Admin].
func (s *Store) DeleteByID(ctx context.Context, id string, want stores.RecordState) (stores.Record, error) {
	h, err := parseID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("memstore: delete: %w", err)
	}
	return s.delete(h, "", "", want)
}

// delete deletes the record of h if it is in state want; scope and key
// are the caller's, when known.
func (s *Store) delete(h hkey, scope, key string, want stores.RecordState) (stores.Record, error) {
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.recs.get(h)
	if !ok {
		return stores.Record{}, fmt.Errorf("memstore: delete: %w: %s", stores.ErrNotFound, describe(h, scope, key))
	}
	rec := s.record(h, r, sh.data[h], s.now(), scope, key)
	if rec.State != want {
		return rec, fmt.Errorf("memstore: delete: %w: %s is %s, not %s", stores.ErrWrongState, describe(h, scope, key), rec.State, want)
	}
	sh.delete(h)
	return rec, nil
}

// describe names a record in an error: by scope and key when known.
func describe(h hkey, scope, key string) string {
	if key == "" {
		return "id " + idOf(h)
	}
	return fmt.Sprintf("scope %q key %q", scope, key)
}

// List implements [stores.Admin]: records in the order of their IDs. A
// Scope or KeyPrefix fails with [stores.ErrNotSupported]. Each page
// reads every record.
func (s *Store) List(ctx context.Context, opts stores.ListOptions) ([]stores.Record, string, error) {
	opts, err := storekit.CheckListOptions(opts)
	var after hkey
	if err == nil && opts.After != "" {
		after, err = parseID(opts.After)
	}
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return nil, "", fmt.Errorf("memstore: list: %w", err)
	}
	if opts.Scope != "" || opts.KeyPrefix != "" {
		return nil, "", fmt.Errorf("memstore: list: %w: records are kept under a hash of (scope, key), so they cannot be listed by scope or key; Get finds one by its scope and key", stores.ErrNotSupported)
	}
	// The limit+1 smallest IDs after the cursor: one more than a page
	// tells whether another page follows.
	type found struct {
		h    hkey
		r    record
		data string
	}
	var page []found
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, sl := range sh.recs.slots {
			if sl.h == (hkey{}) || compareHkey(sl.h, after) <= 0 || (opts.State != 0 && state(sl.r) != opts.State) {
				continue
			}
			if len(page) > opts.Limit && compareHkey(sl.h, page[len(page)-1].h) > 0 {
				continue
			}
			at, _ := slices.BinarySearchFunc(page, sl.h, func(f found, h hkey) int { return compareHkey(f.h, h) })
			page = slices.Insert(page, at, found{sl.h, sl.r, sh.data[sl.h]})
			if len(page) > opts.Limit+1 {
				page = page[:opts.Limit+1]
			}
		}
		sh.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, "", fmt.Errorf("memstore: list: %w", err)
		}
	}
	var next string
	if len(page) > opts.Limit {
		page = page[:opts.Limit]
		next = idOf(page[len(page)-1].h)
	}
	now := s.now()
	out := make([]stores.Record, len(page))
	for i, f := range page {
		out[i] = s.record(f.h, f.r, f.data, now, "", "")
	}
	return out, next, nil
}

// Stats implements [stores.Admin]. Bytes counts the tables' slots and the
// data kept, not the Go runtime's overhead around them.
func (s *Store) Stats(ctx context.Context) (stores.Stats, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return stores.Stats{}, fmt.Errorf("memstore: stats: %w", err)
	}
	now := s.now()
	var (
		st                    stores.Stats
		oldest, newest        int64
		slotBytes, entryBytes = int64(unsafe.Sizeof(slot{})), int64(unsafe.Sizeof(hkey{}) + unsafe.Sizeof(""))
		haveDone              bool
	)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Bytes += int64(len(sh.recs.slots)) * slotBytes
		for _, d := range sh.data {
			st.Bytes += entryBytes + int64(len(d))
		}
		for _, sl := range sh.recs.slots {
			if sl.h == (hkey{}) {
				continue
			}
			r := sl.r
			switch {
			case r.until <= now:
				st.Expired++
			case r.done():
				st.Done++
			default:
				st.Processing++
			}
			if r.done() {
				if !haveDone || r.until < oldest {
					oldest = r.until
				}
				if !haveDone || r.until > newest {
					newest = r.until
				}
				haveDone = true
			}
		}
		sh.mu.Unlock()
	}
	if haveDone {
		st.OldestExpiry, st.NewestExpiry = s.wall(oldest), s.wall(newest)
	}
	return st, nil
}

// Purge implements [stores.Admin]: it is Sweep.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return 0, fmt.Errorf("memstore: purge: %w", err)
	}
	return int64(s.Sweep()), nil
}

// record describes h's record r, whose data is data, at now; scope and
// key are the caller's, when known.
func (s *Store) record(h hkey, r record, data string, now int64, scope, key string) stores.Record {
	rec := stores.Record{
		ID:      idOf(h),
		State:   state(r),
		Expired: r.until <= now,
	}
	if key != "" {
		rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	}
	if r.done() {
		rec.ExpiresAt = s.wall(r.until)
		if data != "" {
			rec.Data = []byte(data)
		}
	} else {
		rec.Token = strconv.FormatUint(r.token, 16)
		rec.LeaseUntil = s.wall(r.until)
		if data != "" {
			rec.Owner = []byte(data) // a processing record's owner
		}
	}
	return rec
}

// wall turns the store's nanoseconds (see now) into a time.
func (s *Store) wall(ns int64) time.Time {
	if s.mono {
		return s.start.Add(time.Duration(ns))
	}
	return time.Unix(0, ns)
}

func state(r record) stores.RecordState {
	if r.done() {
		return stores.StateDone
	}
	return stores.StateProcessing
}

// idOf is a record's ID: its hash in hexadecimal.
func idOf(h hkey) string {
	var b [16]byte
	for i := range 8 {
		b[i] = byte(h.a >> (56 - 8*i))
		b[8+i] = byte(h.b >> (56 - 8*i))
	}
	return hex.EncodeToString(b[:])
}

// parseID is the inverse of idOf, for GetByID, DeleteByID and a List
// cursor.
func parseID(id string) (hkey, error) {
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != 16 {
		return hkey{}, fmt.Errorf("%w: %q is not a memstore record ID", stores.ErrInvalidArgument, id)
	}
	var h hkey
	for i := range 8 {
		h.a = h.a<<8 | uint64(b[i])
		h.b = h.b<<8 | uint64(b[8+i])
	}
	return h, nil
}

// compareHkey orders hashes as their IDs sort.
func compareHkey(x, y hkey) int {
	if c := cmp.Compare(x.a, y.a); c != 0 {
		return c
	}
	return cmp.Compare(x.b, y.b)
}
