package memstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The Store: New, the lease-mode calls on the sharded tables, the
// sweeper and Close. The tables are in table.go, the admin interface in
// admin.go.

// Store is the in-memory store. Create it with New.
type Store struct {
	cfg    Config
	mono   bool      // the system clock: now is time.Since(start)
	start  time.Time // with a monotonic reading
	seeds  [2]maphash.Seed
	mask   uint64
	shards []shard
	tokens atomic.Uint64
	// maxLease is the longest lease given so far, in nanoseconds: how long
	// Sweep keeps an expired processing record.
	maxLease atomic.Int64
	closed   atomic.Bool
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

var _ stores.Store = (*Store)(nil)

// Capabilities implements [stores.Store]: no bounds (a duration is capped
// at about 292 years, data is kept whatever its size), every call a map
// operation under a mutex (NonBlocking), and the Admin interface.
func (s *Store) Capabilities() stores.Capabilities {
	return stores.Capabilities{Kind: "memstore", NonBlocking: true, Admin: true, Owners: true}
}

// New returns a Store and starts its sweeper; Close stops it.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Store{
		cfg:    cfg,
		seeds:  [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		mask:   uint64(cfg.Shards - 1),
		shards: make([]shard, cfg.Shards),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if _, ok := cfg.Clock.(stores.SystemClock); ok {
		s.mono, s.start = true, time.Now()
	}
	// Tokens start at a random point so two stores in one process (or one
	// store before and after a restart) do not hand out the same sequence.
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("memstore: seeding tokens: %w", err)
	}
	s.tokens.Store(binary.LittleEndian.Uint64(b[:]) >> 2)
	go s.sweepLoop()
	return s, nil
}

// scopedKey is what is hashed: the two strings, compared (and hashed) as a
// pair, so that ("ab", "c") and ("a", "bc") are different values.
type scopedKey struct{ scope, key string }

type shard struct {
	mu   sync.Mutex
	recs table
	data map[hkey]string // done records' data, when not empty
}

// setData keeps data with h's done record, or drops what was kept.
func (sh *shard) setData(h hkey, data string) {
	if data != "" {
		if sh.data == nil {
			sh.data = make(map[hkey]string)
		}
		sh.data[h] = data
	} else if sh.data != nil {
		delete(sh.data, h)
	}
}

func (sh *shard) delete(h hkey) {
	sh.recs.delete(h)
	if sh.data != nil {
		delete(sh.data, h)
	}
}

// claim checks h's record at now and, if it is free, writes a processing
// record until until under token, keeping owner with it. It reports the
// result, a live done record's data (Duplicate), or the owner kept by the
// record held (InProgress) or taken over, and whether an expired lease
// was taken over (Claimed). A processing record's owner lives in the side
// map of done records' data: a record has one or the other.
func (sh *shard) claim(h hkey, now, until int64, token uint64, owner string) (res stores.Result, data string, takeover bool) {
	p, ok := sh.recs.slot(h)
	r := *p
	switch {
	case ok && r.until > now && r.done():
		return stores.Duplicate, sh.data[h], false
	case ok && r.until > now:
		return stores.InProgress, sh.data[h], false
	}
	takeover = ok && !r.done()
	if takeover {
		data = sh.data[h]
	}
	*p = record{until: until, token: token}
	sh.setData(h, owner)
	return stores.Claimed, data, takeover
}

// hash returns the record key of (scope, key): its 128-bit hash, two
// 64-bit maphash sums of the pair under the store's two random seeds
// (drawn by New), never the key itself. A record then costs no
// allocation and holds no pointer, and a key handed in as a substring of
// a large payload is never kept. Two keys are taken for one only on a
// 128-bit collision, and the seeds never leave the process, so nobody can
// craft one.
func (s *Store) hash(scope, key string) hkey {
	v := scopedKey{scope, key}
	h := hkey{maphash.Comparable(s.seeds[0], v), maphash.Comparable(s.seeds[1], v)}
	if h == (hkey{}) {
		h.b = 1 // the zero hkey marks an empty slot
	}
	return h
}

func (s *Store) shard(h hkey) *shard { return &s.shards[h.a&s.mask] }

// now returns the store's time in nanoseconds. On the system clock that
// is the monotonic time since New: records never leave the process, so
// they need no wall time, a wall-clock step cannot expire or revive them,
// and a monotonic read costs about half of time.Now. An injected Clock is
// read as Unix nanoseconds.
func (s *Store) now() int64 {
	if s.mono {
		return int64(time.Since(s.start))
	}
	return s.cfg.Clock.Now().UnixNano()
}

// Claim implements [stores.Store].
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	return s.ClaimOwned(ctx, scope, keys, lease, nil)
}

// ClaimOwned implements [stores.OwnerClaimer]: owner is kept beside the
// processing records, as a done record's data is.
func (s *Store) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckKeys(keys), s.Capabilities().CheckLease(lease), stores.CheckOwner(owner)); err != nil {
		return nil, fmt.Errorf("memstore: claim: %w", err)
	}
	s.noteLease(lease)
	token := s.tokens.Add(1)
	cb := &claimBuf{Claim: stores.Claim{Scope: scope, Keys: keys}}
	c := &cb.Claim

	if len(keys) == 1 {
		h := s.hash(scope, keys[0])
		sh := s.shard(h)
		sh.mu.Lock()
		now := s.now()
		var data string
		c.Result, data, c.Takeover = sh.claim(h, now, after(now, lease), token, string(owner))
		sh.mu.Unlock()
		if data != "" {
			if c.Result == stores.Duplicate {
				c.Data = []byte(data)
			} else {
				c.Owner = []byte(data)
			}
		}
	} else {
		s.claimMulti(c, token, lease, string(owner))
	}
	if c.Result == stores.Claimed {
		c.Token = cb.token(token)
	}
	return c, nil
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

// claimBuf allocates a claim and the bytes of its token together: one
// allocation instead of two on every claim.
type claimBuf struct {
	stores.Claim
	buf [16]byte // a uint64 in hexadecimal
}

// token formats t into the buffer and returns it as a string that shares
// the buffer's memory. The buffer is never written again, so the string
// is immutable as Go requires.
func (cb *claimBuf) token(t uint64) string {
	// strconv.AppendUint(buf, t, 16), written out: its general loop
	// costs a claim more than this one.
	i := len(cb.buf)
	for {
		i--
		cb.buf[i] = hexDigits[t&15]
		if t >>= 4; t == 0 {
			break
		}
	}
	return unsafe.String(&cb.buf[i], len(cb.buf)-i)
}

const hexDigits = "0123456789abcdef"

// parseToken reads a token as strconv.ParseUint(s, 16, 64) does, faster:
// ok is false for an empty string, a byte that is not a hexadecimal
// digit, or a value above 64 bits.
func parseToken(s string) (t uint64, ok bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		if t>>60 != 0 {
			return 0, false // one more digit would overflow 64 bits
		}
		t = t<<4 | uint64(d)
	}
	return t, true
}

// hashes returns the hashes of c's keys, in a caller's buffer when they
// fit.
func (s *Store) hashes(c *stores.Claim, buf []hkey) []hkey {
	hs := buf[:0]
	for _, k := range c.Keys {
		hs = append(hs, s.hash(c.Scope, k))
	}
	return hs
}

// claimMulti locks every shard the keys fall in, in index order so that
// concurrent multi-key claims cannot deadlock, then checks and writes.
func (s *Store) claimMulti(c *stores.Claim, token uint64, lease time.Duration, owner string) {
	hs := s.hashes(c, make([]hkey, 0, 4))
	idx := s.lockShards(hs)
	defer s.unlockShards(idx)
	now := s.now()
	inProgress := false
	var held string // the owner of the first key held
	for _, h := range hs {
		sh := s.shard(h)
		r, ok := sh.recs.get(h)
		if !ok || r.until <= now {
			continue
		}
		if r.done() {
			c.Result = stores.Duplicate
			if d := sh.data[h]; d != "" {
				c.Data = []byte(d)
			}
			return
		}
		if held == "" {
			held = sh.data[h]
		}
		inProgress = true
	}
	if inProgress {
		c.Result = stores.InProgress
		if held != "" {
			c.Owner = []byte(held)
		}
		return
	}
	for _, h := range hs {
		if r, ok := s.shard(h).recs.get(h); ok && r.token == token {
			continue // a repeated key
		}
		_, was, takeover := s.shard(h).claim(h, now, after(now, lease), token, owner)
		c.Takeover = c.Takeover || takeover
		if was != "" && c.Owner == nil {
			c.Owner = []byte(was)
		}
	}
	c.Result = stores.Claimed
}

func (s *Store) lockShards(hs []hkey) []int {
	idx := make([]int, 0, len(hs))
	for _, h := range hs {
		idx = append(idx, int(h.a&s.mask))
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		s.shards[i].mu.Lock()
	}
	return idx
}

func (s *Store) unlockShards(idx []int) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// update applies fn to every record of a Claimed claim after checking that
// each is still processing under the claim's token.
// arg is the check of the call's other argument (a lease or retention).
func (s *Store) update(ctx context.Context, op string, c *stores.Claim, arg error, fn func(sh *shard, h hkey, r *record, now int64)) error {
	token, err := s.claimToken(ctx, c, arg)
	if err != nil {
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	// A processing record whose lease ran out still belongs to its owner
	// until someone takes it over: a slow handler finishing just after its
	// lease, with nobody else waiting, completes fine.
	if len(c.Keys) == 1 {
		// The common case: one shard, one lookup.
		h := s.hash(c.Scope, c.Keys[0])
		sh := s.shard(h)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		r := sh.recs.ref(h)
		if r == nil || r.token != token {
			return fmt.Errorf("memstore: %s: %w: scope %q key %q", op, stores.ErrLostClaim, c.Scope, c.Keys[0])
		}
		fn(sh, h, r, s.now())
		return nil
	}
	hs := s.hashes(c, make([]hkey, 0, 4))
	idx := s.lockShards(hs)
	defer s.unlockShards(idx)
	now := s.now()
	for i, h := range hs {
		if r, ok := s.shard(h).recs.get(h); !ok || r.token != token {
			return fmt.Errorf("memstore: %s: %w: scope %q key %q", op, stores.ErrLostClaim, c.Scope, c.Keys[i])
		}
	}
	for _, h := range hs {
		// Looked up again: fn may have moved records of the same shard.
		sh := s.shard(h)
		if r := sh.recs.ref(h); r != nil {
			fn(sh, h, r, now)
		}
	}
	return nil
}

// Complete implements [stores.Store].
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	d := string(data)
	return s.update(ctx, "complete", c, s.Capabilities().CheckRetention(retention), func(sh *shard, h hkey, r *record, now int64) {
		*r = record{until: after(now, retention)}
		sh.setData(h, d)
	})
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	return s.update(ctx, "release", c, nil, func(sh *shard, h hkey, _ *record, _ int64) {
		sh.delete(h)
	})
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	arg := s.Capabilities().CheckLease(lease)
	if arg == nil {
		s.noteLease(lease)
	}
	return s.update(ctx, "extend", c, arg, func(_ *shard, _ hkey, r *record, now int64) {
		r.until = after(now, lease)
	})
}

// Len returns the number of records held, live or expired but not yet
// swept. It is meant for tests and metrics.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.recs.len()
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes expired records now and returns how many it removed. The
// background sweeper calls it every SweepInterval. Expired processing
// records are kept for one more SweepInterval or longest lease given so
// far, whichever is longer, so a takeover soon after expiry is still
// reported as one.
func (s *Store) Sweep() int {
	now := s.now()
	grace := max(int64(s.cfg.SweepInterval), s.maxLease.Load())
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		removed += sh.recs.deleteIf(func(h hkey, r record) bool {
			if r.until > now || (!r.done() && after(r.until, time.Duration(grace)) >= now) {
				return false
			}
			if sh.data != nil {
				delete(sh.data, h)
			}
			return true
		})
		sh.mu.Unlock()
	}
	return removed
}

func (s *Store) sweepLoop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Close stops the sweeper and waits for it. Records are kept, but every
// later call returns [stores.ErrClosed]. It is idempotent.
func (s *Store) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.stop)
	})
	select {
	case <-s.done:
		return nil
	default:
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// after returns the instant d after t, in the store's nanoseconds,
// saturated at math.MaxInt64: a lease or retention too long to represent
// lasts for ever instead of wrapping around into the past.
func after(t int64, d time.Duration) int64 {
	if int64(d) > math.MaxInt64-t {
		return math.MaxInt64
	}
	return t + int64(d)
}

// claimToken checks a call on claim c whose other argument's check is arg,
// and returns c's token.
func (s *Store) claimToken(ctx context.Context, c *stores.Claim, arg error) (uint64, error) {
	var token uint64
	err := storekit.CheckClaim(c)
	if err == nil {
		var ok bool
		if token, ok = parseToken(c.Token); !ok || token == 0 {
			err = fmt.Errorf("%w: token %q is not a memstore token", stores.ErrInvalidArgument, c.Token)
		}
	}
	return token, storekit.CheckCall(ctx, s.closed.Load(), err, arg)
}
