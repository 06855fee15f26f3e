package redisstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The admin interface. A record's ID is its Redis key, written as
// redis-cli shows it; GetByID and DeleteByID take it back. List and Stats SCAN the keys under the prefix on
// every node (every master in Redis Cluster, every shard of a Ring) and
// read each record with a one-key script. The readable layout keeps the
// scope of every record and the key of every record but those stored as
// digests (DigestKeysLongerThan): List selects by scope with a SCAN
// pattern, and Stats counts by scope. With CompactKeys neither is kept:
// a List by Scope or KeyPrefix fails with stores.ErrNotSupported, and
// Stats has no per-scope counts. A key under the prefix that is not a
// record of the store (not in its layout, a value it did not write, no
// expiry, or one Config.Foreign names) is passed over by both, and Stats
// counts it in Skipped.
//
// Redis deletes a record when its PX runs out, so an expired done record
// is never seen, and Purge has nothing to do. A processing record whose
// lease ran out stays for one more lease length: it is reported Expired.

var _ stores.Admin = (*Store)(nil)

// scanCount is the COUNT hint of the admin SCANs.
const scanCount = 1000

// Get implements [stores.Admin].
func (s *Store) Get(ctx context.Context, scope, key string) (stores.Record, error) {
	rkey, err := s.adminKey(ctx, scope, key, nil)
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	rec, err := s.get(ctx, rkey, fmt.Sprintf("scope %q key %q", scope, key))
	if err != nil {
		return stores.Record{}, err
	}
	rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	return rec, nil
}

// GetByID implements [stores.Admin]: id is the record's Redis key as
// Record.ID shows it.
func (s *Store) GetByID(ctx context.Context, id string) (stores.Record, error) {
	rkey, err := s.keyOfID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	return s.get(ctx, rkey, "id "+id)
}

// get reads the record of rkey; what names it in errors.
func (s *Store) get(ctx context.Context, rkey, what string) (stores.Record, error) {
	v, err := s.runPlain(ctx, op{script: readScript, keys: []string{rkey}})
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w", s.classifyCall(ctx, err))
	}
	value, pttl, ok, err := parseRead(v)
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	if !ok {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w: %s", stores.ErrNotFound, what)
	}
	rec, err := s.record(rkey, value, pttl, msNow())
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	return rec, nil
}

// Delete implements [stores.Admin]: one script, atomic on the key's node.
func (s *Store) Delete(ctx context.Context, scope, key string, want stores.RecordState) (stores.Record, error) {
	rkey, err := s.adminKey(ctx, scope, key, storekit.CheckState(want))
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: delete: %w", err)
	}
	rec, err := s.delete(ctx, rkey, want, fmt.Sprintf("scope %q key %q", scope, key))
	if rec.ID != "" {
		rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	}
	return rec, err
}

// DeleteByID implements [stores.Admin], as Delete does; id as in
// GetByID.
func (s *Store) DeleteByID(ctx context.Context, id string, want stores.RecordState) (stores.Record, error) {
	rkey, err := s.keyOfID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: delete: %w", err)
	}
	return s.delete(ctx, rkey, want, "id "+id)
}

// delete deletes the record of rkey if it is in state want; what names
// it in errors.
func (s *Store) delete(ctx context.Context, rkey string, want stores.RecordState, what string) (stores.Record, error) {
	arg := "d"
	if want == stores.StateProcessing {
		arg = "p"
	}
	v, err := s.runPlain(ctx, op{script: deleteStateScript, keys: []string{rkey}, args: []any{arg}})
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: delete: %w", s.classifyCall(ctx, err))
	}
	a, ok := v.([]any)
	if !ok {
		return stores.Record{}, fmt.Errorf("redisstore: delete: unexpected reply %v", v)
	}
	if len(a) == 0 {
		return stores.Record{}, fmt.Errorf("redisstore: delete: %w: %s", stores.ErrNotFound, what)
	}
	deleted, ok1 := a[0].(int64)
	value, pttl, ok2, err := parseRead(a[1:])
	if !ok1 || !ok2 || err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: delete: unexpected reply %v", v)
	}
	rec, err := s.record(rkey, value, pttl, msNow())
	if err != nil {
		return stores.Record{}, fmt.Errorf("redisstore: delete: %w", err)
	}
	if deleted != 1 {
		return rec, fmt.Errorf("redisstore: delete: %w: %s is %s, not %s", stores.ErrWrongState, what, rec.State, want)
	}
	return rec, nil
}

// keyOfID is the Redis key of a record ID: the inverse of printable, for
// a key under the prefix in the store's layout.
func (s *Store) keyOfID(id string) (string, error) {
	rkey, ok := unprintable(id)
	if !ok || !s.ownKey(rkey) {
		return "", fmt.Errorf("%w: %q is not the ID of a record of this store (its Redis key, as redis-cli shows it, under the prefix %q)", stores.ErrInvalidArgument, id, s.cfg.Prefix)
	}
	return rkey, nil
}

// ownKey reports whether rkey is a key the store writes: under its
// prefix, in its layout.
func (s *Store) ownKey(rkey string) bool {
	rest, ok := strings.CutPrefix(rkey, s.cfg.Prefix)
	if !ok {
		return false
	}
	if s.cfg.CompactKeys {
		return len(rest) == compactLen
	}
	_, _, scopeOK, _ := s.decodeKey(rkey)
	return scopeOK
}

// List implements [stores.Admin]: records in SCAN order, node by node.
// With CompactKeys every record is stored under a digest of (scope, key),
// so a List by Scope or KeyPrefix fails with [stores.ErrNotSupported]; Get
// finds a record by its scope and key.
//
// A page ends where a SCAN reply ends, and the cursor is that reply's
// SCAN cursor: a SCAN cursor stays valid while the node's hash table
// grows, shrinks or rehashes, but the order and the grouping of the keys
// it returns do not, so a page may not resume from the middle of a reply
// asked for again. When the records a reply selects do not fit in the
// page, the SCAN is asked again from the same cursor for fewer keys; a
// reply that still holds more (a hash bucket is returned whole) leaves
// the ones not listed in the cursor, and the next page lists them first.
func (s *Store) List(ctx context.Context, opts stores.ListOptions) ([]stores.Record, string, error) {
	opts, err := storekit.CheckListOptions(opts)
	var cur listCursor
	if err == nil && opts.After != "" {
		cur, err = parseCursor(opts.After)
	}
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return nil, "", fmt.Errorf("redisstore: list: %w", err)
	}
	if s.cfg.CompactKeys && (opts.Scope != "" || opts.KeyPrefix != "") {
		return nil, "", fmt.Errorf("redisstore: list: %w: CompactKeys keeps no scope or key to list by", stores.ErrNotSupported)
	}
	nodes, err := s.scanNodes(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("redisstore: list: %w", err)
	}
	first := 0
	if opts.After != "" {
		if first = slices.IndexFunc(nodes, func(n scanNode) bool { return n.addr == cur.addr }); first < 0 {
			return nil, "", fmt.Errorf("redisstore: list: %w: the cursor's node %s is not a node of the store's Redis now", stores.ErrInvalidArgument, cur.addr)
		}
	}
	pattern := s.matchPattern(opts.Scope, opts.Scope != "")
	var out []stores.Record
	for ni := first; ni < len(nodes); ni++ {
		n := nodes[ni]
		var (
			at      uint64 // the SCAN cursor
			pending []string
		)
		if ni == first {
			at, pending = cur.scan, cur.pending
		}
		count := int64(scanCount)
		for {
			var (
				keys []string
				next uint64
			)
			rest := len(pending) > 0
			if rest {
				// What the previous page's last reply held beyond it;
				// the SCAN goes on from at afterwards (0: it was done).
				keys, next, pending = pending, at, nil
			} else if keys, next, err = n.client.Scan(ctx, at, pattern, count).Result(); err != nil {
				return nil, "", fmt.Errorf("redisstore: list: scan %s: %w", n.addr, s.classifyCall(ctx, err))
			}
			recs, err := s.readAll(ctx, keys)
			if err != nil {
				return nil, "", fmt.Errorf("redisstore: list: %w", err)
			}
			var sel []int // the records of keys that opts selects
			for i, r := range recs {
				if r != nil && matches(*r, opts) {
					sel = append(sel, i)
				}
			}
			room := opts.Limit - len(out)
			if len(sel) > room && !rest && count > int64(room) {
				// Too many for the page: ask for fewer keys from the same
				// cursor, at least half as many each time.
				count = max(int64(room), min(count/2, count*int64(room)/int64(len(sel))))
				continue
			}
			count = scanCount
			take := min(len(sel), room)
			for _, i := range sel[:take] {
				out = append(out, *recs[i])
			}
			if take < len(sel) {
				c := listCursor{addr: n.addr, scan: next}
				for _, i := range sel[take:] {
					c.pending = append(c.pending, keys[i])
				}
				return out, c.String(), nil
			}
			if len(out) == opts.Limit {
				// A full page: the cursor resumes after this reply.
				c := listCursor{addr: n.addr, scan: next}
				if next == 0 {
					if ni+1 == len(nodes) {
						return out, "", nil
					}
					c.addr = nodes[ni+1].addr
				}
				return out, c.String(), nil
			}
			if next == 0 {
				break
			}
			at = next
		}
	}
	return out, "", nil
}

// matches reports whether r is one opts selects: of its scope, state and
// key prefix. The SCAN pattern selects the scope of the keys a SCAN
// returns, but not of those a cursor carries (the rest of a reply beyond
// its page), which are the cursor's caller's text: every record is
// checked.
func matches(r stores.Record, opts stores.ListOptions) bool {
	if opts.Scope != "" && (!r.ScopeKnown || r.Scope != opts.Scope) || opts.State != 0 && r.State != opts.State {
		return false
	}
	return opts.KeyPrefix == "" || (r.KeyKnown && strings.HasPrefix(r.Key, opts.KeyPrefix))
}

// Stats implements [stores.Admin]. Bytes is the sum of MEMORY USAGE of
// every record (-1 when the server refuses MEMORY USAGE).
func (s *Store) Stats(ctx context.Context) (stores.Stats, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return stores.Stats{}, fmt.Errorf("redisstore: stats: %w", err)
	}
	nodes, err := s.scanNodes(ctx)
	if err != nil {
		return stores.Stats{}, fmt.Errorf("redisstore: stats: %w", err)
	}
	st := stores.Stats{PerScope: !s.cfg.CompactKeys}
	total := &stores.ScopeStats{}
	scopes := map[string]*stores.ScopeStats{}
	pattern := s.matchPattern("", false)
	for _, n := range nodes {
		var at uint64
		for {
			keys, next, err := n.client.Scan(ctx, at, pattern, scanCount).Result()
			if err != nil {
				return stores.Stats{}, fmt.Errorf("redisstore: stats: scan %s: %w", n.addr, s.classifyCall(ctx, err))
			}
			keys = slices.DeleteFunc(keys, func(k string) bool {
				if s.isRecordKey(k) {
					return false
				}
				skip(&st, k)
				return true
			})
			ops := make([]op, len(keys))
			for i, k := range keys {
				ops[i] = op{script: peekScript, keys: []string{k}}
			}
			vals, errs := s.runPipelined(ctx, ops) // admin calls do not wait
			now := msNow()
			for i, k := range keys {
				if errs[i] != nil {
					return stores.Stats{}, fmt.Errorf("redisstore: stats: key %q: %w", printable(k), s.classifyCall(ctx, errs[i]))
				}
				p, ok := vals[i].([]any)
				if !ok || (len(p) != 0 && len(p) != 3) {
					return stores.Stats{}, fmt.Errorf("redisstore: stats: key %q: unexpected reply %v", printable(k), vals[i])
				}
				if len(p) == 0 {
					continue // gone since the SCAN
				}
				head, ok1 := p[0].(string)
				pttl, ok2 := p[1].(int64)
				mem, ok3 := p[2].(int64)
				if !ok1 || !ok2 || !ok3 {
					return stores.Stats{}, fmt.Errorf("redisstore: stats: key %q: unexpected reply %v", printable(k), vals[i])
				}
				r, err := s.peek(head, pttl, now)
				if err != nil {
					skip(&st, k) // a value the store did not write
					continue
				}
				if st.Bytes >= 0 {
					st.Bytes += mem
					if mem < 0 {
						st.Bytes = -1
					}
				}
				tally(total, r)
				if st.PerScope {
					scope, _, _, _ := s.decodeKey(k) // isRecordKey decoded it
					sc := scopes[scope]
					if sc == nil {
						sc = &stores.ScopeStats{Scope: scope}
						scopes[scope] = sc
					}
					tally(sc, r)
				}
			}
			if next == 0 {
				break
			}
			at = next
		}
	}
	st.Counts, st.OldestExpiry, st.NewestExpiry = total.Counts, total.OldestExpiry, total.NewestExpiry
	if st.PerScope {
		st.Scopes = make([]stores.ScopeStats, 0, len(scopes))
		for _, sc := range scopes {
			st.Scopes = append(st.Scopes, *sc)
		}
		slices.SortFunc(st.Scopes, func(a, b stores.ScopeStats) int { return cmp.Compare(a.Scope, b.Scope) })
	}
	return st, nil
}

// skip counts k in st as a key that is not a record of the store.
func skip(st *stores.Stats, k string) {
	st.Skipped++
	if len(st.SkippedSample) < stores.MaxSkippedSample {
		st.SkippedSample = append(st.SkippedSample, printable(k))
	}
}

// isRecordKey reports whether the admin interface reads k, a key under
// the prefix, as a record: one of the store's layout that Foreign does
// not name.
func (s *Store) isRecordKey(k string) bool {
	return (s.cfg.Foreign == nil || !s.cfg.Foreign(k)) && s.ownKey(k)
}

// tally adds r to st.
func tally(st *stores.ScopeStats, r stores.Record) {
	switch {
	case r.Expired:
		st.Expired++
	case r.State == stores.StateDone:
		st.Done++
	default:
		st.Processing++
	}
	if r.State != stores.StateDone {
		return
	}
	if st.OldestExpiry.IsZero() || r.ExpiresAt.Before(st.OldestExpiry) {
		st.OldestExpiry = r.ExpiresAt
	}
	if r.ExpiresAt.After(st.NewestExpiry) {
		st.NewestExpiry = r.ExpiresAt
	}
}

// Purge implements [stores.Admin]. Redis deletes every record when its
// time is up (a processing record one lease after its lease ends, as
// the contract allows): there is nothing to purge, and Purge returns 0.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return 0, fmt.Errorf("redisstore: purge: %w", err)
	}
	return 0, nil
}

// adminKey checks the arguments of a Get or Delete (arg: the check of
// its other argument) and returns the record's Redis key.
func (s *Store) adminKey(ctx context.Context, scope, key string, arg error) (string, error) {
	err := storekit.CheckRecordKey(key)
	if err == nil {
		_, err = s.recordKeys(scope, []string{key})
	}
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, arg); err != nil {
		return "", err
	}
	return s.encodeKey(scope, key), nil
}

// record describes the record value of rkey, whose remaining TTL is pttl
// ms at now. Its scope and key are filled in as far as the layout keeps
// them.
func (s *Store) record(rkey, value string, pttl int64, now time.Time) (stores.Record, error) {
	r, err := s.peek(value, pttl, now)
	if err != nil {
		return stores.Record{}, fmt.Errorf("key %q: %w", printable(rkey), err)
	}
	rec, _ := decodeValue(value) // peek decoded it
	r.Data, r.Owner = rec.data, ownerOf(value)
	r.ID = printable(rkey)
	r.Scope, r.Key, r.ScopeKnown, r.KeyKnown = s.decodeKey(rkey)
	return r, nil
}

// peek describes a record from the start of its value (at least its
// first 64 bytes: all of a processing value up to its lease), without its
// data or owner.
func (s *Store) peek(head string, pttl int64, now time.Time) (stores.Record, error) {
	if pttl < 0 {
		// -1: no expiry, which this store never writes.
		return stores.Record{}, fmt.Errorf("redisstore: a record without an expiry: not written by this store")
	}
	rec, err := decodeValue(head)
	if err != nil {
		return stores.Record{}, err
	}
	if !rec.processing {
		return stores.Record{State: stores.StateDone, ExpiresAt: now.Add(time.Duration(pttl) * time.Millisecond)}, nil
	}
	lease, err := leaseMS(head)
	if err != nil {
		return stores.Record{}, err
	}
	return stores.Record{
		State:      stores.StateProcessing,
		Token:      rec.token,
		LeaseUntil: now.Add(time.Duration(pttl-lease) * time.Millisecond),
		// The claim script's test of a live lease is PTTL > lease.
		Expired: pttl <= lease,
	}, nil
}

// readAll reads the records of keys, in one pipeline (split per node by
// go-redis). A key gone since the SCAN is nil, and so is a key that is
// not a record of the store (isRecordKey), or holds a value it did not
// write: List passes over them.
func (s *Store) readAll(ctx context.Context, keys []string) ([]*stores.Record, error) {
	var ops []op
	var at []int // the index in keys of each op
	for i, k := range keys {
		if s.isRecordKey(k) {
			ops = append(ops, op{script: readScript, keys: []string{k}})
			at = append(at, i)
		}
	}
	vals, errs := s.runPipelined(ctx, ops) // admin calls do not wait
	now := msNow()
	out := make([]*stores.Record, len(keys))
	for j, i := range at {
		k := keys[i]
		if errs[j] != nil {
			return nil, fmt.Errorf("key %q: %w", printable(k), s.classifyCall(ctx, errs[j]))
		}
		value, pttl, ok, err := parseRead(vals[j])
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", printable(k), err)
		}
		if !ok {
			continue
		}
		if r, err := s.record(k, value, pttl, now); err == nil {
			out[i] = &r
		}
	}
	return out, nil
}

// scanNode is a Redis server holding records: the one of a *redis.Client, a
// master of a Cluster, a shard of a Ring.
type scanNode struct {
	addr   string
	client *redis.Client
}

// scanNodes returns the nodes to SCAN, by address.
func (s *Store) scanNodes(ctx context.Context) ([]scanNode, error) {
	var (
		mu    sync.Mutex
		nodes []scanNode
		add   = func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			nodes = append(nodes, scanNode{c.Options().Addr, c})
			mu.Unlock()
			return nil
		}
		err error
	)
	switch c := s.client.(type) {
	case *redis.Client:
		return []scanNode{{c.Options().Addr, c}}, nil
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *redis.Ring:
		err = c.ForEachShard(ctx, add)
	default:
		return nil, fmt.Errorf("%w: cannot SCAN the nodes of a %T", stores.ErrNotSupported, s.client)
	}
	if err != nil {
		return nil, s.classifyCall(ctx, err)
	}
	slices.SortFunc(nodes, func(a, b scanNode) int { return cmp.Compare(a.addr, b.addr) })
	return nodes, nil
}

// listCursor is where a List resumes: on the node at addr, with the
// keys of pending (what the last SCAN reply held beyond the page), then
// at SCAN cursor scan (0 after pending: that node's SCAN is done).
type listCursor struct {
	addr    string
	scan    uint64
	pending []string
}

// cursorVersion 1 resumed in the middle of a SCAN reply asked for again,
// which may skip keys: its cursors are refused.
const cursorVersion = 2

func (c listCursor) String() string {
	b := []byte{cursorVersion}
	b = binary.AppendUvarint(b, uint64(len(c.addr)))
	b = append(b, c.addr...)
	b = binary.AppendUvarint(b, c.scan)
	for _, k := range c.pending {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseCursor(s string) (listCursor, error) {
	bad := fmt.Errorf("%w: %q is not a redisstore List cursor", stores.ErrInvalidArgument, s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 1 || b[0] != cursorVersion {
		return listCursor{}, bad
	}
	b = b[1:]
	field := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", false
		}
		f := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return f, true
	}
	addr, ok := field()
	if !ok || addr == "" {
		return listCursor{}, bad
	}
	c := listCursor{addr: addr}
	scan, k := binary.Uvarint(b)
	if k <= 0 {
		return listCursor{}, bad
	}
	c.scan, b = scan, b[k:]
	for len(b) > 0 {
		key, ok := field()
		if !ok {
			return listCursor{}, bad
		}
		c.pending = append(c.pending, key)
	}
	return c, nil
}

// msNow is the time to add a remaining TTL to: Redis counts milliseconds.
func msNow() time.Time { return time.Now().Truncate(time.Millisecond) }
