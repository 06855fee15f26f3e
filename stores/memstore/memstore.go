// Package memstore is the embedded, single-process dedup store: records live
// in the Go heap, in sharded maps, and vanish with the process.
//
// Use it for tests, for the embedded demo, and for consumers where one
// process is the only consumer of a queue and a restart may legitimately
// forget what was done (a restart also loses every record, so a redelivery
// after a crash runs the handler again). For anything shared by several
// processes or surviving restarts use redisstore or sqlstore.
//
// # Memory
//
// A done record costs its key (rounded up to a Go size class: 48 bytes for
// a 36-byte key), a 16-byte entry and its 16-byte string header in a map
// slot, plus the map's control bytes and load-factor slack: 84 bytes
// per record at one million 36-byte keys (BenchmarkMemoryPerRecord; up to
// about 1.5x that just after a map doubles), plus any data
// (produced messages) kept with it. The background sweeper
// removes expired records every SweepInterval, so the heap holds at most
// (messages per second) x (retention + SweepInterval) records.
package memstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/watermill-dedup/dedup/stores"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Shards is the number of independently locked maps. The default is 64;
	// it must be a power of two no larger than 65536.
	Shards int

	// SweepInterval is how often expired records are removed. The default
	// is one minute. Expired records are never treated as live, whether or
	// not the sweeper has run; sweeping only bounds memory.
	SweepInterval time.Duration

	// Clock tells the time; nil means the system clock. Tests inject a fake.
	Clock stores.Clock
}

// Default values of Config fields.
const (
	DefaultShards        = 64
	DefaultSweepInterval = time.Minute
)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Shards < 0 || c.Shards > 1<<16 || (c.Shards > 0 && c.Shards&(c.Shards-1) != 0) {
		return fmt.Errorf("memstore: Shards must be a power of two between 1 and 65536, got %d", c.Shards)
	}
	if c.SweepInterval < 0 {
		return fmt.Errorf("memstore: SweepInterval must not be negative, got %s", c.SweepInterval)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	c.Clock = stores.ClockOrSystem(c.Clock)
}

// record is one (scope, key): 16 bytes. For a processing record until is
// the lease end and token its owner's; for a done record until is its
// expiry and token is 0. Data kept with a done record lives in a side map,
// so the common record without data pays nothing for it.
type record struct {
	until int64 // unix nanoseconds
	token uint64
}

func (r record) done() bool { return r.token == 0 }

// table holds one scope's records in one shard.
type table struct {
	recs map[string]record
	data map[string]string // done records' data, when not empty
}

func (t *table) setDone(k string, until int64, data string) {
	t.recs[k] = record{until: until}
	if data != "" {
		if t.data == nil {
			t.data = make(map[string]string)
		}
		t.data[k] = data
	} else if t.data != nil {
		delete(t.data, k)
	}
}

func (t *table) delete(k string) {
	delete(t.recs, k)
	if t.data != nil {
		delete(t.data, k)
	}
}

type shard struct {
	mu sync.Mutex
	// scopes maps scope -> table. Two levels keep lookups allocation-free
	// and make (scope, key) pairs collision-free whatever bytes they hold.
	scopes map[string]*table
}

// lookup returns the record of (scope, k) in the shard, if any.
func (sh *shard) lookup(scope, k string) (record, *table, bool) {
	t := sh.scopes[scope]
	if t == nil {
		return record{}, nil, false
	}
	r, ok := t.recs[k]
	return r, t, ok
}

func (sh *shard) table(scope string) *table {
	t := sh.scopes[scope]
	if t == nil {
		t = &table{recs: make(map[string]record)}
		sh.scopes[strings.Clone(scope)] = t
	}
	return t
}

// Store is the in-memory store. Create it with New.
type Store struct {
	cfg    Config
	seed   maphash.Seed
	mask   uint64
	shards []shard
	tokens atomic.Uint64
	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

var (
	_ stores.Store       = (*Store)(nil)
	_ stores.NonBlocking = (*Store)(nil)
)

// NonBlocking reports true: every call is a map operation under a mutex.
func (s *Store) NonBlocking() bool { return true }

// New returns a Store and starts its sweeper; Close stops it.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Store{
		cfg:    cfg,
		seed:   maphash.MakeSeed(),
		mask:   uint64(cfg.Shards - 1),
		shards: make([]shard, cfg.Shards),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].scopes = make(map[string]*table)
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

func (s *Store) shardIndex(key string) int {
	return int(maphash.String(s.seed, key) & s.mask)
}

func (s *Store) now() int64 { return s.cfg.Clock.Now().UnixNano() }

// Claim implements [stores.Store].
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	if s.closed.Load() {
		return nil, stores.ErrClosed
	}
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, fmt.Errorf("%w: lease must be positive, got %s", stores.ErrInvalidArgument, lease)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.now()
	token := s.tokens.Add(1)
	cb := &claimBuf{Claim: stores.Claim{Scope: scope, Keys: keys}}
	c := &cb.Claim

	if len(keys) == 1 {
		sh := &s.shards[s.shardIndex(keys[0])]
		sh.mu.Lock()
		r, t, ok := sh.lookup(scope, keys[0])
		switch {
		case ok && r.until > now && r.done():
			c.Result, c.Data = stores.Duplicate, []byte(t.data[keys[0]])
		case ok && r.until > now:
			c.Result = stores.InProgress
		default:
			if t == nil {
				t = sh.table(scope)
			}
			c.Takeover = ok && !r.done()
			if ok {
				t.delete(keys[0])
			}
			t.recs[cloneIfNew(keys[0], ok)] = record{until: now + int64(lease), token: token}
			c.Result = stores.Claimed
		}
		sh.mu.Unlock()
	} else {
		s.claimMulti(c, now, token, lease)
	}
	if c.Result == stores.Claimed {
		c.Token = cb.token(token)
	}
	return c, nil
}

// claimBuf allocates a claim and the bytes of its token together: one
// allocation instead of two on every claim.
type claimBuf struct {
	stores.Claim
	buf [13]byte // a uint64 in base 36
}

// token formats t into the buffer and returns it as a string that shares
// the buffer's memory. The buffer is never written again, so the string
// is immutable as Go requires.
func (cb *claimBuf) token(t uint64) string {
	b := strconv.AppendUint(cb.buf[:0], t, 36)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// claimMulti locks every shard the keys fall in, in index order so that
// concurrent multi-key claims cannot deadlock, then checks and writes.
func (s *Store) claimMulti(c *stores.Claim, now int64, token uint64, lease time.Duration) {
	idx := s.lockShards(c.Keys)
	defer s.unlockShards(idx)
	inProgress := false
	for _, k := range c.Keys {
		r, t, ok := s.shards[s.shardIndex(k)].lookup(c.Scope, k)
		if !ok || r.until <= now {
			continue
		}
		if r.done() {
			c.Result, c.Data = stores.Duplicate, []byte(t.data[k])
			return
		}
		inProgress = true
	}
	if inProgress {
		c.Result = stores.InProgress
		return
	}
	for _, k := range c.Keys {
		t := s.shards[s.shardIndex(k)].table(c.Scope)
		r, ok := t.recs[k]
		if ok && r.token == token {
			continue // a repeated key
		}
		if ok && !r.done() {
			c.Takeover = true
		}
		if ok {
			t.delete(k)
		}
		t.recs[cloneIfNew(k, ok)] = record{until: now + int64(lease), token: token}
	}
	c.Result = stores.Claimed
}

func (s *Store) lockShards(keys []string) []int {
	idx := make([]int, 0, len(keys))
	for _, k := range keys {
		idx = append(idx, s.shardIndex(k))
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

// cloneIfNew copies a key the first time it is stored: a key handed in may
// share memory with a large payload (a substring), which the store must not
// keep alive for the whole retention window.
func cloneIfNew(k string, exists bool) string {
	if exists {
		return k
	}
	return string([]byte(k))
}

// update applies fn to every record of a Claimed claim after checking that
// each is still processing under the claim's token.
func (s *Store) update(ctx context.Context, c *stores.Claim, fn func(t *table, k string, now int64)) error {
	if s.closed.Load() {
		return stores.ErrClosed
	}
	if c == nil || c.Result != stores.Claimed || c.Token == "" {
		return fmt.Errorf("%w: not a Claimed claim", stores.ErrInvalidArgument)
	}
	token, err := strconv.ParseUint(c.Token, 36, 64)
	if err != nil || token == 0 {
		return fmt.Errorf("%w: token %q is not a memstore token", stores.ErrInvalidArgument, c.Token)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(c.Keys) == 1 {
		// The common case: one shard, one lookup.
		k := c.Keys[0]
		sh := &s.shards[s.shardIndex(k)]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		r, t, ok := sh.lookup(c.Scope, k)
		if !ok || r.token != token {
			return fmt.Errorf("%w: scope %q key %q", stores.ErrLostClaim, c.Scope, k)
		}
		fn(t, k, s.now())
		return nil
	}
	idx := s.lockShards(c.Keys)
	defer s.unlockShards(idx)
	now := s.now()
	for _, k := range c.Keys {
		// A processing record whose lease ran out still belongs to its
		// owner until someone takes it over: a slow handler finishing
		// just after its lease, with nobody else waiting, completes fine.
		if r, _, ok := s.shards[s.shardIndex(k)].lookup(c.Scope, k); !ok || r.token != token {
			return fmt.Errorf("%w: scope %q key %q", stores.ErrLostClaim, c.Scope, k)
		}
	}
	for _, k := range c.Keys {
		t, _ := s.shards[s.shardIndex(k)].scopes[c.Scope]
		fn(t, k, now)
	}
	return nil
}

// Complete implements [stores.Store].
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if retention <= 0 {
		return fmt.Errorf("%w: retention must be positive, got %s", stores.ErrInvalidArgument, retention)
	}
	d := string(data)
	return s.update(ctx, c, func(t *table, k string, now int64) {
		t.setDone(k, now+int64(retention), d)
	})
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	return s.update(ctx, c, func(t *table, k string, _ int64) {
		t.delete(k)
	})
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: lease must be positive, got %s", stores.ErrInvalidArgument, lease)
	}
	return s.update(ctx, c, func(t *table, k string, now int64) {
		r := t.recs[k]
		r.until = now + int64(lease)
		t.recs[k] = r
	})
}

// Len returns the number of records held, live or expired but not yet
// swept. It is meant for tests and metrics.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, t := range sh.scopes {
			n += len(t.recs)
		}
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes expired records now and returns how many it removed. The
// background sweeper calls it every SweepInterval. Expired processing
// records are kept for one more SweepInterval, so a takeover soon after
// expiry is still reported as one.
func (s *Store) Sweep() int {
	now := s.now()
	grace := int64(s.cfg.SweepInterval)
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for scope, t := range sh.scopes {
			for k, r := range t.recs {
				if r.until <= now && (r.done() || r.until+grace <= now) {
					t.delete(k)
					removed++
				}
			}
			if len(t.recs) == 0 {
				delete(sh.scopes, scope)
			}
		}
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
	case <-ctx.Done():
		return ctx.Err()
	}
}

func checkKeys(keys []string) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: no keys", stores.ErrInvalidKey)
	}
	for i, k := range keys {
		if k == "" {
			return fmt.Errorf("%w: key %d is empty", stores.ErrInvalidKey, i)
		}
	}
	return nil
}
