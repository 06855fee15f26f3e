package redisstore

import (
	"cmp"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// The configuration of a Store: Config and BatchConfig, their defaults,
// bounds and validation.

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
		return fmt.Errorf("redisstore: DigestKeysLongerThan (%d) must not be above MaxKeyLen (%d)", c.DigestKeysLongerThan, maxKeyLen)
	}
	if c.MaxData < 0 {
		return fmt.Errorf("redisstore: MaxData must not be negative, got %d", c.MaxData)
	}
	if err := batch.Config(c.Batch).Validate(batchLimits); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return c.validateWait()
}

// validateWait checks WaitReplicas and WaitTimeout.
func (c Config) validateWait() error {
	switch {
	case c.WaitReplicas < 0 || c.WaitReplicas > MaxWaitReplicas:
		return fmt.Errorf("redisstore: WaitReplicas must be 0 (no WAIT) or between 1 and %d, got %d", MaxWaitReplicas, c.WaitReplicas)
	case c.WaitTimeout < 0 || c.WaitTimeout > MaxWaitTimeout:
		return fmt.Errorf("redisstore: WaitTimeout must be 0 (the default, %s) or positive and at most %s, got %s", DefaultWaitTimeout, MaxWaitTimeout, c.WaitTimeout)
	case c.WaitTimeout > 0 && c.WaitReplicas == 0:
		return fmt.Errorf("redisstore: WaitTimeout (%s) is set but WaitReplicas is 0", c.WaitTimeout)
	}
	return nil
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

// checkWaitClient refuses WaitReplicas on a client whose nodes the store
// cannot address one by one (the WAIT must follow the write on its
// node's connection), or whose ReadTimeout would cut a WAIT short
// (go-redis applies it to a whole pipeline, WAIT included).
func checkWaitClient(client redis.UniversalClient, cfg Config) error {
	if cfg.WaitReplicas == 0 {
		return nil
	}
	var read time.Duration
	switch c := client.(type) {
	case *redis.Client:
		read = c.Options().ReadTimeout
	case *redis.ClusterClient:
		read = c.Options().ReadTimeout
	case *redis.Ring:
		read = c.Options().ReadTimeout
	default:
		return fmt.Errorf("redisstore: WaitReplicas needs a *redis.Client, *redis.ClusterClient or *redis.Ring, got %T", client)
	}
	if read > 0 && cfg.WaitTimeout >= read {
		return fmt.Errorf("redisstore: WaitTimeout (%s) must be below the client's ReadTimeout (%s)", cfg.WaitTimeout, read)
	}
	return nil
}
