package middleware

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// StoreErrorPolicy says what happens to a message when the store cannot be
// reached to claim it.
type StoreErrorPolicy uint8

const (
	// FailClosed (the default) returns the store error: the message is
	// nacked and redelivered later, and the handler does not run. Nothing is
	// lost and nothing is doubled; the queue stalls while the store is down.
	FailClosed StoreErrorPolicy = iota
	// FailOpen runs the handler unprotected when the store is down:
	// consumption goes on, but a duplicate delivered during the outage is
	// processed again. Every bypass is counted (OutcomeBypassed) and
	// logged with its keys, for reconciliation.
	//
	// Only an outage is bypassed: an error wrapping stores.ErrUnavailable,
	// or a Claim that outlived StoreTimeout while the message's context
	// was alive. A cancelled message, a closed store, an argument or key
	// the store refuses and an error the store does not classify are
	// handled as under FailClosed: the store may be healthy, and running
	// the handler could repeat an effect it has recorded. A healthy store
	// that makes a Claim wait longer than StoreTimeout (a lock held by an
	// open transaction on the same key, an exhausted connection pool)
	// looks like an outage: keep StoreTimeout above such waits.
	FailOpen
)

// String returns "fail-closed" or "fail-open".
func (p StoreErrorPolicy) String() string {
	switch p {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	default:
		return fmt.Sprintf("StoreErrorPolicy(%d)", uint8(p))
	}
}

// Default values of Config fields.
const (
	DefaultLease          = 30 * time.Second
	DefaultRetention      = 24 * time.Hour
	DefaultStoreTimeout   = 5 * time.Second
	DefaultInProgressPoll = 100 * time.Millisecond
	DefaultScope          = "default"
	// RetentionSafetyFactor is the margin the retention window needs over
	// the broker's maximum redelivery horizon: 30% for the redeliveries
	// that arrive late (consumer restarts, rebalances, clock skew).
	RetentionSafetyFactor = 1.3
)

// Config configures the middleware. The zero value of every field but
// Store means its documented default.
type Config struct {
	// Store keeps the dedup records. Required.
	Store stores.Store

	// Key builds the keys a message claims. The default is
	// keyfuncs.MessageID(). For side-effecting consumers whose producers
	// may republish an event under a new id, claim both the id and a
	// business key with keyfuncs.All.
	Key keyfuncs.KeyFunc

	// Scope separates the records of different consumers of the same
	// messages. The default is the Watermill handler name from the message
	// context, so every handler does its work once; outside a router (no
	// handler name) it is "default". Set it to share records between
	// handlers, or to keep them stable when a handler is renamed.
	Scope string

	// Lease is how long a claim holds its keys before another consumer may
	// take them over, presuming the holder dead. The middleware extends the
	// lease while the handler runs (see Heartbeat), so it bounds how long a
	// crashed consumer blocks a redelivery, not how long a handler may run.
	// The default is 30s.
	Lease time.Duration

	// Heartbeat is how often a running handler's lease is extended. The
	// default is Lease/3; a negative value disables extension (a handler
	// running longer than Lease may then be taken over).
	Heartbeat time.Duration

	// Retention is how long a done record is kept: a redelivery after it
	// is processed again. Make it at least RetentionSafetyFactor x the
	// broker's maximum redelivery horizon (see RedeliveryHorizon). The
	// default is 24h.
	Retention time.Duration

	// RedeliveryHorizon is the longest time after which the broker may
	// still redeliver a message: SQS maxReceiveCount x visibility timeout,
	// the consumer outage budget for RabbitMQ, the group recovery time for
	// Kafka. When set, New logs a warning if Retention is shorter than
	// RetentionSafetyFactor x RedeliveryHorizon, or fails with
	// ErrRetentionTooShort when StrictRetention is set. Zero means unknown.
	RedeliveryHorizon time.Duration
	StrictRetention   bool

	// PublishedAt tells when a message was first published, for the
	// ttl-miss check: a claimed message older than Retention may be a
	// redelivery whose record already expired, and is counted
	// (OutcomeTTLMiss) and logged, never hidden. Nil disables the check.
	// See MetadataTime.
	PublishedAt func(msg *message.Message) (time.Time, bool)

	// StoreTimeout bounds every store call. The default is 5s.
	StoreTimeout time.Duration

	// CompleteTimeout is how long a Complete failed by an outage is
	// retried (with a doubling backoff, the lease kept alive meanwhile)
	// before the middleware gives up and acks the message anyway — its
	// effect happened; the record then stays processing until its lease
	// runs out. (A Complete refused for another reason is not retried; see
	// the README's failure table.)
	// A store outage shorter than this loses nothing and doubles nothing,
	// even when the message's context ends meanwhile (an outer Timeout
	// middleware, a subscriber shutting down): the retries go on, so a
	// router closing during an outage waits up to this long for such a
	// handler. The default is Lease.
	CompleteTimeout time.Duration

	// AsyncComplete acks a message as soon as its handler succeeds and
	// records it done in the background, where the store's batching folds
	// the Complete into the same round trips as the next claims. A
	// sequential consumer (one Kafka partition, one RabbitMQ consumer)
	// then waits for one store round trip per message instead of two.
	//
	// The price is a window, from the ack until the Complete lands
	// (normally one store round trip; through a store outage up to
	// CompleteTimeout after the first failed attempt), in which the
	// record is still processing:
	//   - a duplicate arriving in it gets ErrInProgress (nack and retry),
	//     and nothing runs twice;
	//   - a crash in it leaves the record processing until the lease
	//     expires, after which a duplicate runs the handler again: the
	//     exposure of a crash between the effect and Complete in the
	//     default mode, now also after the ack;
	//   - outputs are returned before they are recorded, so a lost
	//     Complete means a later duplicate re-runs instead of re-emitting.
	//
	// It requires NewMiddleware, whose Close waits for the Completes in
	// flight: call it after the router has stopped. It cannot be combined
	// with Transactional, whose record commits with the handler's writes.
	// The default is off.
	AsyncComplete bool

	// OnStoreError is the policy when Claim fails. The default is
	// FailClosed. FailOpen cannot be combined with Transactional.
	OnStoreError StoreErrorPolicy

	// InProgressWait is how long a delivery whose keys another consumer is
	// processing waits for that run to finish before returning
	// ErrInProgress (which nacks it). While waiting it re-claims every
	// InProgressPoll: when the other run completes the delivery is acked as
	// a duplicate, when it fails the delivery claims the keys and runs. The
	// default, zero, returns ErrInProgress at once; pair that with
	// Watermill's Retry middleware or the broker's redelivery delay.
	InProgressWait time.Duration
	InProgressPoll time.Duration

	// Transactional selects the transactional inbox: Store must implement
	// stores.Inbox (sqlstore does), the record is written in the same
	// database transaction as the handler's own writes, and the handler
	// finds the transaction in its message context (sqlstore.TxFromContext).
	// There is no lease: concurrent duplicates wait on the record's primary
	// key. The default is lease mode.
	Transactional bool

	// Fingerprint, when set, is stored with each done record; a duplicate
	// whose fingerprint differs (the same key reused for different
	// content) fails with an error wrapping stores.ErrFingerprintMismatch
	// instead of being acked. See PayloadFingerprint.
	Fingerprint func(msg *message.Message) []byte

	// Logger receives warnings and errors. The default discards them.
	Logger watermill.LoggerAdapter

	// Metrics receives every outcome and store latency. The default
	// discards them.
	Metrics Metrics
}

// Errors returned by the middleware and by New. Errors of the store
// (stores.ErrLostClaim, ...) and of key functions (keyfuncs.ErrNoKey) are
// wrapped, so errors.Is finds them too.
var (
	// ErrInvalidConfig is wrapped by every error of Config.Validate.
	ErrInvalidConfig = errors.New("dedup middleware: invalid config")

	// ErrRetentionTooShort is returned by New under StrictRetention.
	ErrRetentionTooShort = errors.New("dedup middleware: retention shorter than the redelivery horizon allows")

	// ErrInProgress is returned for a delivery whose keys another consumer
	// is processing. It is retryable: the message is nacked, not lost.
	ErrInProgress = errors.New("dedup: message is being processed by another consumer")

	// ErrStore wraps a failed store call that nacks the message: a Claim
	// or Begin that failed (under FailClosed, or for any error but an
	// outage under FailOpen), so the handler did not run, or a Commit.
	ErrStore = errors.New("dedup: store call failed")

	// ErrCorruptRecord reports stored data the middleware cannot decode.
	ErrCorruptRecord = errors.New("dedup: corrupt stored record data")
)

// Validate reports the first invalid field, naming it and the bound.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	case c.Lease < 0:
		return fmt.Errorf("%w: Lease must not be negative, got %s", ErrInvalidConfig, c.Lease)
	case c.Retention < 0:
		return fmt.Errorf("%w: Retention must not be negative, got %s", ErrInvalidConfig, c.Retention)
	case c.CompleteTimeout < 0:
		return fmt.Errorf("%w: CompleteTimeout must not be negative, got %s", ErrInvalidConfig, c.CompleteTimeout)
	case c.StoreTimeout < 0:
		return fmt.Errorf("%w: StoreTimeout must not be negative, got %s", ErrInvalidConfig, c.StoreTimeout)
	case c.RedeliveryHorizon < 0:
		return fmt.Errorf("%w: RedeliveryHorizon must not be negative, got %s", ErrInvalidConfig, c.RedeliveryHorizon)
	case c.InProgressWait < 0 || c.InProgressPoll < 0:
		return fmt.Errorf("%w: InProgressWait and InProgressPoll must not be negative", ErrInvalidConfig)
	case c.OnStoreError > FailOpen:
		return fmt.Errorf("%w: OnStoreError must be FailClosed or FailOpen, got %s", ErrInvalidConfig, c.OnStoreError)
	}
	lease := c.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	if c.Heartbeat > 0 && c.Heartbeat >= lease {
		return fmt.Errorf("%w: Heartbeat (%s) must be shorter than Lease (%s)", ErrInvalidConfig, c.Heartbeat, lease)
	}
	if c.Transactional {
		if _, ok := c.Store.(stores.Inbox); !ok {
			return fmt.Errorf("%w: Transactional needs a Store implementing stores.Inbox (such as sqlstore); %T does not", ErrInvalidConfig, c.Store)
		}
		if c.OnStoreError == FailOpen {
			return fmt.Errorf("%w: FailOpen cannot be combined with Transactional (the handler's writes need the store's database)", ErrInvalidConfig)
		}
		if c.AsyncComplete {
			return fmt.Errorf("%w: AsyncComplete cannot be combined with Transactional (the record commits with the handler's writes)", ErrInvalidConfig)
		}
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Key == nil {
		c.Key = keyfuncs.MessageID()
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.Lease / 3
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.CompleteTimeout == 0 {
		c.CompleteTimeout = c.Lease
	}
	if c.InProgressPoll == 0 {
		c.InProgressPoll = DefaultInProgressPoll
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Metrics == nil {
		c.Metrics = NopMetrics{}
	}
}

// PayloadFingerprint is a Config.Fingerprint: the first 16 bytes of the
// SHA-256 of the payload.
func PayloadFingerprint(msg *message.Message) []byte {
	sum := sha256.Sum256(msg.Payload)
	return sum[:16]
}

// MetadataTime returns a Config.PublishedAt that reads an RFC 3339 time
// from the named metadata header.
func MetadataTime(name string) func(*message.Message) (time.Time, bool) {
	return func(msg *message.Message) (time.Time, bool) {
		v := msg.Metadata.Get(name)
		if v == "" {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		return t, err == nil
	}
}
