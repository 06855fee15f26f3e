package natsstore

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
)

// The configuration of a Store: Config, its defaults, bounds and
// validation, and the buckets and MaxAge it needs.

// Default values of Config fields, and bounds.
const (
	DefaultBucket       = "dedup"
	DefaultMaxLease     = time.Hour
	DefaultMaxRetention = 24 * time.Hour // dedup.DefaultRetention
	DefaultClockSkew    = time.Minute

	// MaxShards bounds Config.Shards.
	MaxShards = 64
	// MaxDurationLimit bounds Config.MaxLease and MaxRetention: a
	// century.
	MaxDurationLimit = 100 * 365 * 24 * time.Hour
)

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("natsstore: invalid config")

// ErrNoBucket is wrapped by Open's error when a bucket of the config
// does not exist.
var ErrNoBucket = errors.New("natsstore: no such bucket")

// ErrBucketConfig is wrapped by New's error when a bucket exists but
// cannot hold the records the Config allows: under TTLBucket a MaxAge
// (KV TTL) shorter than [Config.RequiredMaxAge], or none at all (lower
// MaxLease or MaxRetention, or raise the bucket's MaxAge: nats stream
// edit STREAM --max-age); under TTLPerKey a MaxAge shorter than two
// MaxLease plus ClockSkew, or a bucket (or a server, for a bucket to
// create) without per-message TTLs; or limits (MaxMsgs, MaxBytes) with
// the discard-old policy, which would drop records before their
// retention ends (remove the limits, or use discard-new: writes then
// fail when the bucket is full).
var ErrBucketConfig = errors.New("natsstore: the bucket's configuration does not fit the store's")

// TTLMode is how the records of a Store are removed once they no longer
// matter: by the bucket's MaxAge, the same for every record, or by a TTL
// of each record's own (per-message TTLs, nats-server 2.11 and later).
type TTLMode int

const (
	// TTLAuto, the default, is TTLPerKey when the server supports
	// per-message TTLs (JetStream API level 1, nats-server 2.11) and
	// every bucket of the config that exists already allows them (New
	// creates missing ones so); else TTLBucket.
	TTLAuto TTLMode = iota
	// TTLBucket removes every record MaxAge after its last write (see
	// Config.RequiredMaxAge): the only mode before nats-server 2.11,
	// and that of a bucket created without per-message TTLs.
	TTLBucket
	// TTLPerKey gives each record a TTL of its own: a done record its
	// retention, a processing record its lease and one more lease, each
	// plus ClockSkew. Retentions are then bounded by the server only
	// (MaxDurationLimit, or the bucket's MaxAge when it has one), not by
	// MaxRetention. New fails with ErrBucketConfig when the server or
	// an existing bucket does not allow per-message TTLs.
	TTLPerKey
)

func (m TTLMode) String() string {
	switch m {
	case TTLAuto:
		return "auto"
	case TTLBucket:
		return "bucket MaxAge"
	case TTLPerKey:
		return "per-key TTL"
	}
	return "TTLMode(" + strconv.Itoa(int(m)) + ")"
}

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Bucket is the KV bucket holding the records, created by New when
	// it does not exist. Stores sharing a NATS system and a Bucket share
	// their records, which is how several consumer processes dedup
	// together. The default is "dedup". It may hold letters, digits, '-'
	// and '_'.
	Bucket string

	// Shards spreads the records over this many buckets, Bucket-0 to
	// Bucket-<Shards-1>, each (scope, key) in the one its digest picks:
	// each bucket is a JetStream stream with its own leader, so in a
	// cluster the writes of the shards go to different servers. The
	// default, 0 or 1, is one bucket named Bucket. At most MaxShards.
	// Changing it forgets the records written before.
	Shards int

	// TTLMode is how records are removed: TTLAuto (the default) picks
	// per-key TTLs where the server and the buckets allow them, else the
	// bucket's MaxAge. Store.TTLMode tells which one New picked.
	TTLMode TTLMode

	// MaxLease is the longest lease Claim and Extend accept, and
	// MaxRetention the longest retention Complete accepts; longer ones
	// fail with stores.ErrInvalidArgument before any I/O. Defaults:
	// DefaultMaxLease (1h) and DefaultMaxRetention (24h, the
	// middleware's default retention). At most MaxDurationLimit.
	//
	// Under TTLBucket they decide the bucket's MaxAge (see
	// RequiredMaxAge): a bucket keeps every record for MaxAge after its
	// last write, whatever its own retention, so they are also what the
	// bucket's disk holds: message rate × MaxAge records. Under
	// TTLPerKey MaxRetention bounds nothing (each record keeps its own
	// retention; Capabilities tells the bound), and MaxLease bounds
	// leases as it does under TTLBucket.
	MaxLease     time.Duration
	MaxRetention time.Duration

	// ClockSkew is how far apart the clocks of the consumer processes
	// and the NATS servers may be: the margin RequiredMaxAge adds. The
	// default is DefaultClockSkew (1 minute).
	ClockSkew time.Duration

	// Replicas and Storage are the replication factor (1, 3 or 5 in a
	// cluster; default 1) and storage (default file) of the buckets New
	// creates. A bucket that exists is used as it is.
	Replicas int
	Storage  jetstream.StorageType

	// Clock tells the time of leases and expiry. nil means the system
	// clock.
	Clock stores.Clock

	// Logger gets one line from New saying which TTLMode the store uses
	// and why. nil means watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// asIs: the buckets are used as they are, never created, whatever
	// their MaxAge (Open).
	asIs bool
}

var bucketRe = regexp.MustCompile(`\A[a-zA-Z0-9_-]+\z`)

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Bucket != "" && !bucketRe.MatchString(c.Bucket):
		return bad("Bucket %q may hold letters, digits, '-' and '_' only", c.Bucket)
	case c.Shards < 0 || c.Shards > MaxShards:
		return bad("Shards must be between 0 and %d, got %d", MaxShards, c.Shards)
	case c.MaxLease < 0 || c.MaxLease > MaxDurationLimit:
		return bad("MaxLease must be between 0 (default) and %s, got %s", MaxDurationLimit, c.MaxLease)
	case c.MaxRetention < 0 || c.MaxRetention > MaxDurationLimit:
		return bad("MaxRetention must be between 0 (default) and %s, got %s", MaxDurationLimit, c.MaxRetention)
	case c.ClockSkew < 0 || c.ClockSkew > MaxDurationLimit:
		return bad("ClockSkew must be between 0 (default) and %s, got %s", MaxDurationLimit, c.ClockSkew)
	case c.Replicas < 0 || c.Replicas > 5:
		return bad("Replicas must be between 0 (default) and 5, got %d", c.Replicas)
	case c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage:
		return bad("Storage must be jetstream.FileStorage or MemoryStorage, got %d", c.Storage)
	case c.TTLMode < TTLAuto || c.TTLMode > TTLPerKey:
		return bad("TTLMode must be TTLAuto, TTLBucket or TTLPerKey, got %d", int(c.TTLMode))
	}
	// The buckets' MaxAge, RequiredMaxAge, must be a duration too: each
	// field within its limit can still add up to more than time.Duration
	// holds.
	d := c
	d.setDefaults()
	if m := max(d.MaxRetention, 2*d.MaxLease); d.ClockSkew > math.MaxInt64-m {
		return bad("max(MaxRetention, 2 x MaxLease) + ClockSkew, the buckets' MaxAge, is over %s", time.Duration(math.MaxInt64))
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.MaxRetention == 0 {
		c.MaxRetention = DefaultMaxRetention
	}
	if c.ClockSkew == 0 {
		c.ClockSkew = DefaultClockSkew
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	c.Clock = stores.ClockOrSystem(c.Clock)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// RequiredMaxAge is the shortest bucket MaxAge (KV TTL) that keeps every
// record as long as the store contract needs it under TTLBucket, with
// the defaults filled in:
//
//	max(MaxRetention, 2 × MaxLease) + ClockSkew
//
// A done record must last its retention; a processing record its lease,
// and one more lease after it ran out, so that a takeover then is
// reported as one (Claim.Takeover). MaxAge counts from the record's last
// write on the server's clock; ClockSkew covers the distance between
// that clock and the consumers'. New creates missing buckets with
// exactly this MaxAge and refuses existing ones with a shorter one
// ([ErrBucketConfig]).
func (c Config) RequiredMaxAge() time.Duration {
	c.setDefaults()
	return max(c.MaxRetention, 2*c.MaxLease) + c.ClockSkew
}

// Buckets returns the names of the buckets the store uses, with the
// defaults filled in.
func (c Config) Buckets() []string {
	c.setDefaults()
	if c.Shards == 1 {
		return []string{c.Bucket}
	}
	out := make([]string, c.Shards)
	for i := range out {
		out[i] = c.Bucket + "-" + strconv.Itoa(i)
	}
	return out
}
