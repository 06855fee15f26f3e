// Package redisstore is the dedup store on Redis (go-redis/v9): the fast,
// shared store for consumers running in many processes.
//
// Every record is one Redis string with a PX expiry, so leases and retention
// need no sweeper, and every operation is one atomic command on the server:
// a Lua script (EVALSHA, falling back to EVAL), or for a single-key claim
// first a plain SET NX GET, which settles a free key or a done one without
// a script. Time is the server's: leases are checked against the key's
// remaining TTL, never against a client clock.
//
// Concurrent calls share pipelines (auto-batching, on by default; see
// [BatchConfig]): a call that finds nothing else out is sent at once, as
// without batching, and calls that arrive while others are out go together
// in one pipeline, each with its own result and its own deadline.
//
// It works unchanged with [*redis.Client] (standalone, or Sentinel through
// redis.NewFailoverClient), [*redis.ClusterClient] and [*redis.Ring]. On a
// single node a claim of several keys is one atomic script. In Redis Cluster
// the keys of one claim (message id, business key) usually hash to
// different slots, so the store claims them one by one in a fixed order and
// undoes the ones it took when a later one is not free; see [Store.Claim]
// for the guarantee. A CROSSSLOT error never reaches the caller.
//
// Redis replicates asynchronously: a failover may lose the writes a
// master acknowledged last, done records and claims among them. With
// Config.WaitReplicas a write succeeds only once that many replicas of
// its node have it (WAIT, one per pipeline and node), and fails with
// [ErrNotReplicated] otherwise; the README says what it guarantees and
// what it costs.
//
// Redis must not evict dedup records: run it with maxmemory-policy
// noeviction. The store checks the policy when it starts and logs an error
// when the server would evict live records (see [Store.CheckServer]).
//
// The Store implements [stores.Admin], which the dedupctl command uses:
// List and Stats SCAN the keys under the prefix on every node. The
// default layout keeps each record's scope and key readable, so records
// are listed and counted by scope (but for keys stored as digests, whose
// key is unknown); with CompactKeys they are known by their Redis key
// only, and a List by scope or key prefix fails with
// [stores.ErrNotSupported]. Keys under the prefix that are not the
// store's records (another layout's, another program's, those
// Config.Foreign names, such as another store's under a longer prefix)
// are passed over, and Stats counts them in Skipped.
//
// The README next to this file describes the key layout, the memory each
// record takes and how to size Redis for a message rate and window.
package redisstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// Default values of Config fields.
const (
	DefaultPrefix        = "dedup:"
	DefaultCompactPrefix = "d:" // the default Prefix with CompactKeys
	DefaultMaxKeyLen     = 1024

	// DefaultMaxData is the default Config.MaxData: the most data a
	// record keeps on a Redis with the default proto-max-bulk-len (512
	// MiB), the longest argument Redis accepts; the record's value is the
	// data and one byte more.
	DefaultMaxData = 512<<20 - 1

	// DefaultMaxBatch is the default BatchConfig.MaxBatch.
	DefaultMaxBatch = 128
	// MaxBatchLimit bounds BatchConfig.MaxBatch.
	MaxBatchLimit = 10000
	// DefaultMaxInFlight is the default BatchConfig.MaxInFlight. Two
	// pipelines out at once keep Redis busy (one is being answered while
	// the next fills) and make batches twice as large as four would: each
	// costs both sides a write, a read and the wake-ups around them, so
	// fewer, larger ones cost less CPU per call (see the README).
	DefaultMaxInFlight = 2
	// MaxInFlightLimit bounds BatchConfig.MaxInFlight.
	MaxInFlightLimit = 1024

	// MaxWaitReplicas bounds Config.WaitReplicas.
	MaxWaitReplicas = 64
	// DefaultWaitTimeout is the default Config.WaitTimeout.
	DefaultWaitTimeout = time.Second
	// MaxWaitTimeout bounds Config.WaitTimeout.
	MaxWaitTimeout = time.Minute
)

// batchLimits are the defaults and bounds of BatchConfig.
var batchLimits = batch.Limits{
	DefaultMaxBatch: DefaultMaxBatch, MaxBatch: MaxBatchLimit,
	DefaultMaxInFlight: DefaultMaxInFlight, MaxInFlight: MaxInFlightLimit,
}

// serverCheckTimeout bounds the check New starts in the background.
const serverCheckTimeout = 10 * time.Second

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Prefix starts every key the store writes. The default is "dedup:",
	// or "d:" with CompactKeys.
	// Stores sharing a Redis and a Prefix share their records, which is how
	// several consumer processes dedup together; give unrelated
	// applications different prefixes. Changing it (or DigestKeysLongerThan)
	// forgets every record written before.
	//
	// A prefix holding a Redis Cluster hash tag, such as "{dedup}:", puts
	// every record in one slot, hence on one node: multi-key claims are then
	// single atomic scripts in Cluster too, at the price of not spreading
	// the records over the cluster.
	Prefix string

	// Foreign, when set, names keys under Prefix that are not this store's
	// records although they may look like them: those of another store
	// whose Prefix starts with this one's, such as router_example's runs
	// under "dedup:<run id>:", inside the default "dedup:". The admin
	// interface's List and Stats pass over them, as over every key under
	// Prefix that is not one of the store's records, and Stats counts
	// them in stores.Stats.Skipped. It is given the Redis key, and may be
	// called from several goroutines at once; the message path (Claim,
	// Complete, ...) never calls it.
	Foreign func(key string) bool

	// MaxKeyLen is the longest scope, and the longest key not stored as a
	// digest (see DigestKeysLongerThan and CompactKeys), in bytes. Longer
	// ones fail with stores.ErrInvalidKey (keys) or
	// stores.ErrInvalidArgument (scopes) before any I/O. The default is
	// 1024. Every byte of scope and key is kept in Redis for the whole
	// retention window, in every record (but for CompactKeys).
	MaxKeyLen int

	// DigestKeysLongerThan, when positive, stores keys longer than this many
	// bytes as the first 128 bits of their SHA-256 instead of verbatim (a
	// key that is exactly a UUID is always packed losslessly into 16 bytes
	// instead). It bounds memory for long keys, at a collision probability
	// of about n²/2¹²⁹ for n live records of one scope: negligible, but not
	// zero as for verbatim keys. It must be 0 (the default: never) or
	// between 16 and MaxKeyLen: every key is then accepted
	// (Capabilities().MaxKey is 0), up to it verbatim, longer ones as
	// digests.
	DigestKeysLongerThan int

	// CompactKeys stores every record under Prefix ‖ the first 96 bits of
	// SHA-256 of (scope, key), instead of the readable layout: a 14-byte
	// Redis key with the default "d:" prefix, whatever the scope and key,
	// which puts a done record in the allocator's smallest size classes
	// (96.8 bytes a record instead of 112.8 for UUID keys; see the README).
	// Keys may then be of any length. The price: two different (scope, key)
	// pairs share a record if their digests collide, with probability
	// about n²/2⁹⁷ for n live records under the prefix (10⁻¹² for 432
	// million records), and a shared record makes the second message a
	// Duplicate; keys can no longer be read or SCANned by scope. It must
	// not be combined with DigestKeysLongerThan. Switching it on or off
	// forgets every record written before.
	CompactKeys bool

	// MaxData is the most bytes of data a done record keeps
	// (Capabilities().MaxData): Complete refuses more with
	// stores.ErrTooLarge before any I/O. Redis refuses a command whose
	// argument is longer than its proto-max-bulk-len (512 MiB by default,
	// never less than 1 MiB) and closes the connection, and the record's
	// value is the data and one byte more, so MaxData must be below the
	// server's setting: the default, DefaultMaxData, suits the default
	// server; set it lower for a server configured lower. CheckServer
	// reads proto-max-bulk-len and reports a node that cannot take
	// MaxData ([ErrDataLimit]); from then on Complete also refuses, before
	// any I/O, data that node would refuse.
	MaxData int

	// Batch configures auto-batching: concurrent calls share pipelines.
	// It is on by default.
	Batch BatchConfig

	// Logger receives the server check's findings. nil means
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// SkipServerCheck stops New from checking the server's
	// maxmemory-policy in the background. Call [Store.CheckServer]
	// yourself, or not at all.
	SkipServerCheck bool

	// WaitReplicas, when positive, makes Claim, Complete, Release and
	// Extend succeed only once what they wrote has reached this many
	// replicas of the node that took it: each pipeline the store sends
	// to a node ends with WAIT WaitReplicas WaitTimeout (one WAIT per
	// pipeline and node, not per call; a shorter timeout when a call's
	// deadline is nearer), and a call whose write the WAIT did not see
	// acknowledged by enough replicas in time, or whose deadline passed
	// while the store waited for replicas, fails with
	// [ErrNotReplicated]. A Claim that fails so leaves no claim behind
	// (the store gives it back) and must not run the handler; a
	// Complete that fails so is retried by the middleware. Claims
	// answering Duplicate or InProgress wrote nothing and wait for
	// nothing; a Complete, Release or Extend refused with
	// stores.ErrLostClaim is confirmed as well (see the README:
	// a retried Complete relies on it). Admin calls do not wait.
	//
	// It is 0 (the default: Redis's asynchronous replication, a
	// failover may lose the last writes) or between 1 and
	// MaxWaitReplicas. It bounds what a failover can lose, not more:
	// WAIT is not strong consistency (the README says which failovers
	// can still lose an acknowledged write). With it, a node with fewer
	// connected replicas than WaitReplicas fails every write: keep it
	// below the replicas each master has to ride out one replica down.
	//
	// It needs a *redis.Client (standalone, or Sentinel through
	// redis.NewFailoverClient), a *redis.ClusterClient or a *redis.Ring:
	// the WAIT must follow the write on the same connection, so the
	// store sends each node's pipeline on that node's client itself.
	WaitReplicas int

	// WaitTimeout bounds each WAIT: a write not acknowledged by
	// WaitReplicas replicas by then fails with [ErrNotReplicated]. The
	// default is DefaultWaitTimeout (1s); at most MaxWaitTimeout, and
	// below the client's ReadTimeout (3s by default), which go-redis
	// applies to the whole pipeline (New refuses a WaitTimeout that is
	// not). A WAIT that would outlast the deadline of a call it confirms
	// is shortened to leave that call a quarter of its time (up to
	// 250ms) for the answer, so a call fails as not replicated before its
	// deadline, and never as an outage. It may only be set with
	// WaitReplicas.
	WaitTimeout time.Duration
}

// BatchConfig configures auto-batching (group commit): Claim, Complete,
// Release and Extend calls that arrive while earlier ones are waiting for
// Redis are sent together, as one pipeline of EVALSHA calls, and each gets
// its own result or error. A call that finds a pipeline slot free is sent
// at once, alone, as without batching: there is no timer and no added
// latency, and batches grow only while calls are waiting anyway. The
// exception is a call whose context carries a stores.WithLinger (the
// middleware's background Complete): it waits up to that long to go out
// with the next call. See the README for how it works and what it gains.
//
// Each call keeps its own context: one that ends while the call waits for
// a slot, or while its pipeline is out, returns the context's error at
// once, and a claim taken for a caller that has gone is released. A
// pipeline of several calls runs until the latest of their deadlines, so
// set ContextTimeoutEnabled on the client (see [New]).
//
// The zero value turns batching on with the defaults.
type BatchConfig struct {
	// Disabled sends every call on its own, one round trip each.
	Disabled bool

	// MaxBatch is the most calls one pipeline carries. The default is
	// DefaultMaxBatch (128); at most MaxBatchLimit (10000).
	MaxBatch int

	// MaxInFlight is the most pipelines (and lone calls) out at once, so
	// the most connections the store uses at a time, per node in Redis
	// Cluster and a Ring, where each node batches its own calls (a slow
	// node holds up the calls on its keys only). Calls beyond wait, and
	// go out together in the next pipeline. The default is DefaultMaxInFlight (2); at most
	// MaxInFlightLimit (1024). Raise it when the round trip, not CPU, is
	// the limit (a distant Redis): the store sends at most MaxInFlight ×
	// MaxBatch calls per round trip.
	MaxInFlight int
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.MaxKeyLen < 0 {
		return fmt.Errorf("redisstore: MaxKeyLen must not be negative, got %d", c.MaxKeyLen)
	}
	if c.DigestKeysLongerThan != 0 && c.DigestKeysLongerThan < digestLen {
		return fmt.Errorf("redisstore: DigestKeysLongerThan must be 0 (never) or at least %d, got %d", digestLen, c.DigestKeysLongerThan)
	}
	if c.CompactKeys && c.DigestKeysLongerThan != 0 {
		return fmt.Errorf("redisstore: DigestKeysLongerThan must be 0 with CompactKeys (every key is a digest then), got %d", c.DigestKeysLongerThan)
	}
	if maxKeyLen := cmp.Or(c.MaxKeyLen, DefaultMaxKeyLen); c.DigestKeysLongerThan > maxKeyLen {
		// Keys between the two would be refused while longer ones are
		// digested: no single bound on keys (Capabilities.MaxKey) would
		// say what the store accepts.
		return fmt.Errorf("redisstore: DigestKeysLongerThan (%d) must not be above MaxKeyLen (%d): keys between the two would be refused, longer ones digested", c.DigestKeysLongerThan, maxKeyLen)
	}
	if c.MaxData < 0 {
		return fmt.Errorf("redisstore: MaxData must not be negative, got %d", c.MaxData)
	}
	if err := batch.Config(c.Batch).Validate(batchLimits); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return c.validateWait()
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
		if c.CompactKeys {
			c.Prefix = DefaultCompactPrefix
		}
	}
	c.Batch = BatchConfig(batch.Config(c.Batch).WithDefaults(batchLimits))
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.MaxData == 0 {
		c.MaxData = DefaultMaxData
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.WaitReplicas > 0 && c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
}

// Store is the Redis store. Create it with New.
type Store struct {
	client redis.UniversalClient
	cfg    Config

	// sharded is true when the keys of one claim may live on different
	// nodes, so a script may only touch one key (see cluster.go).
	sharded bool

	// noSetNXGet is set once a server refused SET NX GET (Redis < 7.0):
	// single-key claims then always run the claim script.
	noSetNXGet atomic.Bool

	// serverMaxData is the most data every node CheckServer read takes
	// (its proto-max-bulk-len less one), when below Config.MaxData; 0
	// while unknown or not below.
	serverMaxData atomic.Int64

	// The lanes coalesce concurrent ops into pipelines (batching.go):
	// lane0 when the keys of a call live on one node, else one lane a
	// node, by address, in lanes (*lane), made on first use until Close
	// sets lanesClosed. None when Batch.Disabled.
	lane0       *lane
	lanes       sync.Map
	lanesMu     sync.Mutex
	lanesClosed bool

	// redirects counts the MOVED and ASK replies followed by waited
	// pipelines (WaitReplicas), for the tests.
	redirects atomic.Int64
	// nodeWaits holds each node's pipelines with WAIT (*nodeWaits), by
	// address, with WaitReplicas (see cutByWait).
	nodeWaits sync.Map

	closed    atomic.Bool
	closeOnce sync.Once
	cancel    context.CancelFunc
	checkDone chan struct{}
	closeD    chan struct{} // closed when Close has stopped everything

	// The store's background work: the undos of failed claims (see
	// background). bgCtx ends when a Close gives up waiting for it; bg
	// counts it, and bgClosed, under bgMu, stops new work once Close
	// waits for bg.
	bgCtx    context.Context
	bgStop   context.CancelFunc
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup
}

var _ stores.Store = (*Store)(nil)

// New returns a Store on client. It never closes client: Close the client
// yourself after closing the Store.
//
// Unless cfg.SkipServerCheck is set, New starts [Store.CheckServer] in the
// background (bounded by 10s and stopped by Close), so a Redis that is down
// at startup delays nothing; its findings go to cfg.Logger.
//
// Set ContextTimeoutEnabled on the client's options so that the deadlines
// of the contexts handed to the store (the middleware's StoreTimeout) bound
// every call; without it go-redis bounds calls by its ReadTimeout and
// WriteTimeout only. (With batching, a call waiting on a pipeline returns
// at its own deadline either way; a call sent on its own, and the
// pipeline itself, rely on the client for theirs.)
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: client is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := checkWaitClient(client, cfg); err != nil {
		return nil, err
	}
	s := &Store{
		client:    client,
		cfg:       cfg,
		sharded:   isSharded(client) && !hasHashTag(cfg.Prefix),
		checkDone: make(chan struct{}),
		closeD:    make(chan struct{}),
	}
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	if !cfg.Batch.Disabled && !s.sharded {
		s.lane0 = s.newLane()
	}
	ctx, cancel := context.WithTimeout(context.Background(), serverCheckTimeout)
	s.cancel = cancel
	if cfg.SkipServerCheck {
		close(s.checkDone)
		return s, nil
	}
	go func() {
		defer close(s.checkDone)
		err := s.CheckServer(ctx)
		if err != nil && !errors.Is(err, ErrEvictionPolicy) && !errors.Is(err, ErrDataLimit) && !errors.Is(err, ErrTooFewReplicas) && ctx.Err() == nil {
			// CheckServer logged eviction itself; this is "could not ask".
			s.cfg.Logger.Info("redisstore: could not check the server's maxmemory-policy; make sure it is noeviction", watermill.LogFields{"err": err.Error()})
		}
	}()
	return s, nil
}

// isSharded reports whether client spreads keys over several nodes. Only a
// plain *redis.Client (one node, or a Sentinel-managed primary) runs a
// multi-key script as it is; any other UniversalClient gets the one-key-per-
// script path, which is correct everywhere.
func isSharded(client redis.UniversalClient) bool {
	_, single := client.(*redis.Client)
	return !single
}

// Claim implements [stores.Store].
//
// On one node (a *redis.Client, or any client with a Prefix holding a hash
// tag) it is one script, atomic over all keys. A claim of one key is a SET
// NX GET, followed by the claim script only when the key is processing
// (see claimOne).
//
// In Redis Cluster, a claim of several keys claims them one call per key,
// in the order of their Redis keys; a key that is done or held stops the
// claim, and the keys already taken are put back exactly as they were (a
// taken-over expired lease is restored with its remaining TTL). The result
// is all-or-nothing, and no key is ever held by two claims. What it gives up
// is isolation: while a claim is under way, a concurrent claim sharing one
// of its keys may see that key held and get InProgress although the first
// claim then fails too, so both messages are retried later (never lost,
// never run twice). The fixed order makes sure that of two such claims at
// least one wins the keys they share, as with ordered locking.
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	rkeys, err := s.recordKeys(scope, keys)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, storekit.CheckLease(lease)); err != nil {
		return nil, fmt.Errorf("redisstore: claim: %w", err)
	}
	token := rand.Text()
	ctx = s.traced(ctx)
	r, err := s.claim(ctx, rkeys, token, lease)
	if err != nil {
		return nil, fmt.Errorf("redisstore: claim: %w", s.classifyCall(ctx, s.cutByWait(ctx, err)))
	}
	c := &stores.Claim{Scope: scope, Keys: keys}
	switch r.result {
	case 1:
		c.Result, c.Token, c.Takeover = stores.Claimed, token, len(r.taken) > 0
	case 2:
		rec, err := decodeValue(r.value)
		if err != nil {
			return nil, fmt.Errorf("redisstore: claim: %w", err)
		}
		c.Result, c.Data = stores.Duplicate, rec.data
	default:
		c.Result = stores.InProgress
	}
	return c, nil
}

// claim claims rkeys under token: one key with claimOne, several with one
// script on one node, or key by key in Redis Cluster (claimOrdered).
// A claim that failed gives back what it took (see giveBack).
func (s *Store) claim(ctx context.Context, rkeys []string, token string, lease time.Duration) (claimReply, error) {
	var (
		r   claimReply
		err error
	)
	switch {
	case len(rkeys) == 1:
		r, err = s.claimOne(ctx, rkeys[0], token, lease, true)
	case s.sharded:
		return s.claimOrdered(ctx, rkeys, token, lease) // gives back itself
	default:
		r, err = s.claimScript(ctx, rkeys, token, lease, true)
	}
	if err != nil {
		s.giveBack(ctx, undoOf(err), lease)
	}
	return r, err
}

func (s *Store) claimScript(ctx context.Context, rkeys []string, token string, lease time.Duration, wait bool) (claimReply, error) {
	o := claimOp(rkeys, token, lease)
	o.nowait = !wait
	v, err := s.run(ctx, o)
	if err != nil {
		return claimReply{}, err
	}
	return parseClaim(v)
}

// claimOne claims one key. It first sends SET key processing NX GET PX
// (Redis 7.0 and later), which settles the two common cases in one plain
// command, cheaper for Redis than a script: the key is free (the SET took
// it: Claimed), or it holds a done record (the SET changed nothing and
// returned it: Duplicate). Only when the key is processing — a lease that
// may have run out, or this very token after a retried claim — does it run
// the claim script, which reads the lease against the key's PTTL. On a
// server older than 7.0, which refuses NX with GET, it goes straight to the
// script from then on. With WaitReplicas, what it writes is confirmed by
// its pipeline's WAIT unless !wait (the caller confirms it).
func (s *Store) claimOne(ctx context.Context, rkey, token string, lease time.Duration, wait bool) (claimReply, error) {
	if !s.noSetNXGet.Load() {
		o := claimSetOp(rkey, token, lease)
		o.nowait = !wait
		v, err := s.run(ctx, o)
		switch {
		case errors.Is(err, redis.Nil):
			return claimReply{result: 1}, nil
		case err == nil:
			if prev, ok := v.(string); ok {
				if rec, err := decodeValue(prev); err == nil && !rec.processing {
					return claimReply{result: 2, value: prev}, nil
				}
			}
			// Processing, or not ours to read: the script decides.
		case isSetNXGetRefused(err):
			s.noSetNXGet.Store(true)
		case isWriteRefused(err):
			// Out of memory (or a replica): writes are refused, reads
			// served. The script reads first, so a done record is still
			// a Duplicate; only a key it must write fails.
		default:
			return claimReply{}, err
		}
	}
	return s.claimScript(ctx, []string{rkey}, token, lease, wait)
}

// Complete implements [stores.Store]. A record whose lease ran out but that
// nobody took over yet is still the claim's: a slow handler finishing just
// after its lease completes fine, for up to one more lease length.
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	rkeys, err := s.claimKeys(ctx, c, errors.Join(storekit.CheckRetention(retention), s.checkData(data)))
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	err = s.fenced(ctx, "complete", c, rkeys, func(keys []string) op {
		return completeOp(keys, c.Token, retention, data)
	})
	return s.tooLargeAfter(ctx, data, err)
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	rkeys, err := s.claimKeys(ctx, c, nil)
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return s.fenced(ctx, "release", c, rkeys, func(keys []string) op {
		return releaseOp(keys, c.Token)
	})
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	rkeys, err := s.claimKeys(ctx, c, storekit.CheckLease(lease))
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	return s.fenced(ctx, "extend", c, rkeys, func(keys []string) op {
		return extendOp(keys, c.Token, lease)
	})
}

// fenced runs the token-checked op that build makes for rkeys: as one
// script on one node, or key by key in Redis Cluster (see fencedSharded).
func (s *Store) fenced(ctx context.Context, what string, c *stores.Claim, rkeys []string, build func([]string) op) error {
	ctx = s.traced(ctx)
	if s.waiting() {
		// A refusal is confirmed by the WAIT too (see wait.go).
		untouched := build
		build = func(keys []string) op { return untouched(keys).touching() }
	}
	if s.sharded && len(rkeys) > 1 {
		return s.fencedSharded(ctx, what, c, rkeys, build)
	}
	v, err := s.run(ctx, build(rkeys))
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", what, s.classifyCall(ctx, s.cutByWait(ctx, err)))
	}
	lost, err := parseFenced(v)
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", what, err)
	}
	if lost >= 0 {
		return s.lostClaim(what, c, rkeys[lost])
	}
	return nil
}

// checkData refuses data above MaxData, or above what a node
// CheckServer read would take.
func (s *Store) checkData(data []byte) error {
	return storekit.CheckData(s.Capabilities(), data, s.serverMaxData.Load(), "its proto-max-bulk-len is below Config.MaxData")
}

// lostClaim builds the ErrLostClaim error for the record key rkey of c.
func (s *Store) lostClaim(what string, c *stores.Claim, rkey string) error {
	for _, k := range c.Keys {
		if s.encodeKey(c.Scope, k) == rkey {
			return fmt.Errorf("redisstore: %s: %w: scope %q key %q", what, stores.ErrLostClaim, c.Scope, k)
		}
	}
	return fmt.Errorf("redisstore: %s: %w: scope %q", what, stores.ErrLostClaim, c.Scope)
}

// recordKeys validates scope and keys and returns the distinct Redis keys
// of the claim, in the order of their first occurrence.
func (s *Store) recordKeys(scope string, keys []string) ([]string, error) {
	if err := storekit.CheckKeys(keys); err != nil {
		return nil, err
	}
	if len(scope) > s.cfg.MaxKeyLen {
		return nil, fmt.Errorf("%w: scope is %d bytes, longer than MaxKeyLen (%d)", stores.ErrInvalidArgument, len(scope), s.cfg.MaxKeyLen)
	}
	for i, k := range keys {
		if len(k) > s.cfg.MaxKeyLen && !s.cfg.CompactKeys && !s.digests(k) {
			return nil, fmt.Errorf("%w: key %d is %d bytes, longer than MaxKeyLen (%d); set DigestKeysLongerThan to store long keys as digests",
				stores.ErrInvalidKey, i, len(k), s.cfg.MaxKeyLen)
		}
	}
	rkeys := make([]string, 0, len(keys))
	for _, k := range keys {
		rk := s.encodeKey(scope, k)
		dup := false
		for _, seen := range rkeys {
			if seen == rk {
				dup = true
				break
			}
		}
		if !dup {
			rkeys = append(rkeys, rk)
		}
	}
	return rkeys, nil
}

// claimKeys checks a call on claim c whose other argument's check is arg
// (see storekit.CheckCall), and returns c's record keys.
func (s *Store) claimKeys(ctx context.Context, c *stores.Claim, arg error) ([]string, error) {
	var rkeys []string
	err := storekit.CheckClaim(c)
	if err == nil && len(c.Token) != tokenLen {
		err = fmt.Errorf("%w: not a Claimed claim of a redisstore", stores.ErrInvalidArgument)
	}
	if err == nil {
		if rkeys, err = s.recordKeys(c.Scope, c.Keys); err != nil {
			err = fmt.Errorf("%w: the claim's keys are invalid: %w", stores.ErrInvalidArgument, err)
		}
	}
	return rkeys, storekit.CheckCall(ctx, s.closed.Load(), err, arg)
}

// Capabilities implements [stores.Store]: scopes of at most MaxKeyLen
// bytes, and keys too unless they are stored as digests (CompactKeys,
// DigestKeysLongerThan); data up to Config.MaxData; the Admin interface.
func (s *Store) Capabilities() stores.Capabilities {
	c := stores.Capabilities{Kind: "redisstore", MaxScope: s.cfg.MaxKeyLen, MaxKey: s.cfg.MaxKeyLen, MaxData: s.cfg.MaxData, Admin: true}
	if s.cfg.CompactKeys || s.cfg.DigestKeysLongerThan > 0 {
		c.MaxKey = 0
	}
	return c
}

// Close stops the background server check, if still running, and waits
// for it; for each node's batcher, which sends the calls still queued and
// waits for its pipelines out and its undos of claims whose callers gave
// up (bounded by 2s each); and for the give-backs of failed claims and
// put-backs of fenced calls (bounded by the lease, or the TTLs put back,
// 2s at least). When ctx ends first it returns ctx's error and cancels
// the give-backs and put-backs under way, leaving their keys to their
// leases; it does not stop the batchers, whose pipelines and undos run to
// their own bounds. Every later call returns [stores.ErrClosed]; calls
// already under way finish, but what they would undo after Close is left
// to its lease. It never closes the client. It is idempotent.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
		go func() {
			<-s.checkDone
			s.closeLanes()
			s.bgMu.Lock()
			s.bgClosed = true
			s.bgMu.Unlock()
			s.bg.Wait()
			s.bgStop()
			close(s.closeD)
		}()
	})
	select {
	case <-s.closeD:
		return nil
	case <-ctx.Done():
		s.bgStop()
		return ctx.Err()
	}
}

// background runs f in a goroutine of its own, under a context that ends
// after timeout or when a Close gives up waiting for it, and returns a
// channel closed once f has returned; nil, without running f, once Close
// waits for the background work.
func (s *Store) background(timeout time.Duration, f func(ctx context.Context)) <-chan struct{} {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return nil
	}
	s.bg.Add(1)
	done := make(chan struct{})
	go func() {
		defer s.bg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(s.bgCtx, timeout)
		defer cancel()
		f(ctx)
	}()
	return done
}

// waitWhile waits until done is closed (nil: at once) or ctx ends.
func waitWhile(ctx context.Context, done <-chan struct{}) {
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}
