package middleware

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
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

// Mode is how the middleware records a message done.
type Mode uint8

const (
	// ModeLease (the default) claims the keys under a lease before the
	// handler runs, extends the lease while it runs, and records the
	// message done (Complete) before it is acked. It works with every
	// store.
	ModeLease Mode = iota

	// ModeAsyncComplete is ModeLease, but acks a message as soon as its
	// handler succeeds and records it done in the background, where the
	// store's batching folds the Complete into the same round trips as the
	// next claims. A sequential consumer (one Kafka partition, one
	// RabbitMQ consumer) then waits for one store round trip per message
	// instead of two.
	//
	// The price is a window, from the ack until the Complete lands
	// (normally one store round trip; through a store outage up to
	// Tuning.CompleteTimeout after the first failed attempt), in which the
	// record is still processing:
	//   - a duplicate arriving in it at this middleware waits for the
	//     Complete (as the first delivery's ack would have in ModeLease);
	//     at another consumer it gets ErrInProgress (nack and retry); either
	//     way nothing runs twice;
	//   - a crash in it leaves the record processing until the lease
	//     expires, after which a duplicate runs the handler again: the
	//     exposure of a crash between the effect and Complete in
	//     ModeLease, now also after the ack;
	//   - outputs are returned before they are recorded, so a lost
	//     Complete means a later duplicate re-runs instead of re-emitting.
	//
	// On a store that never blocks (stores.NonBlocking, such as memstore)
	// there is no round trip to hide, and the Complete runs before the ack
	// as in ModeLease.
	//
	// Close the Middleware after the router has stopped: Close waits for
	// the Completes in flight.
	ModeAsyncComplete

	// ModeTransactional is the transactional inbox: Store must implement
	// stores.Inbox (sqlstore does), the record is written in the same
	// database transaction as the handler's own writes, and the handler
	// finds the transaction in its message context
	// (sqlstore.TxFromContext). There is no lease: concurrent duplicates
	// wait on the record's primary key. Effects written in the store's
	// database are never doubled. It cannot be combined with FailOpen.
	ModeTransactional
)

// String returns "lease", "async-complete" or "transactional".
func (m Mode) String() string {
	switch m {
	case ModeLease:
		return "lease"
	case ModeAsyncComplete:
		return "async-complete"
	case ModeTransactional:
		return "transactional"
	default:
		return fmt.Sprintf("Mode(%d)", uint8(m))
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
// Store means its documented default, so a common configuration is a few
// lines:
//
//	middleware.Config{
//		Store:  store,
//		Key:    keyfuncs.All(keyfuncs.Prefix("msg:", keyfuncs.MessageID()), keyfuncs.Prefix("pay:", keyfuncs.JSON("payment_id"))),
//		Logger: logger,
//	}
type Config struct {
	// Store keeps the dedup records. Required.
	Store stores.Store

	// Mode is how a message is recorded done: ModeLease (the default),
	// ModeAsyncComplete or ModeTransactional.
	Mode Mode

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
	// lease while the handler runs (see Tuning.Heartbeat), so it bounds how
	// long a crashed consumer blocks a redelivery, not how long a handler
	// may run. The default is 30s. Not used by ModeTransactional.
	Lease time.Duration

	// Retention is how long a done record is kept: a redelivery after it
	// is processed again. Make it at least RetentionSafetyFactor x the
	// broker's maximum redelivery horizon (see CheckRetention). The
	// default is 24h.
	Retention time.Duration

	// StoreTimeout bounds every store call. The default is 5s.
	StoreTimeout time.Duration

	// OnStoreError is the policy when Claim fails. The default is
	// FailClosed. FailOpen cannot be combined with ModeTransactional.
	OnStoreError StoreErrorPolicy

	// InProgressWait is how long a delivery whose keys another consumer is
	// processing waits for that run to finish before returning
	// ErrInProgress (which nacks it). While waiting it re-claims every
	// Tuning.InProgressPoll: when the other run completes the delivery is
	// acked as a duplicate, when it fails the delivery claims the keys and
	// runs. The default, zero, returns ErrInProgress at once; pair that
	// with Watermill's Retry middleware or the broker's redelivery delay.
	InProgressWait time.Duration

	// PublishedAt tells when a message was first published, for the
	// ttl-miss check: a claimed message older than Retention may be a
	// redelivery whose record already expired, and is counted
	// (OutcomeTTLMiss) and logged, never hidden. Nil disables the check.
	// See MetadataTime and the PublishedAt functions of the keyfuncs
	// broker packages.
	PublishedAt func(msg *message.Message) (time.Time, bool)

	// Fingerprint, when set, is stored with each done record; a duplicate
	// whose fingerprint differs (the same key reused for different
	// content) fails with an error wrapping ErrFingerprintMismatch
	// instead of being acked. See PayloadFingerprint.
	Fingerprint func(msg *message.Message) []byte

	// Logger receives what the middleware reports: every message it fails
	// for good (no key, fingerprint mismatch, corrupt record) and every
	// bypass, takeover, ttl miss and store failure. The default logs
	// through log/slog's default logger as it is at each line (so
	// slog.SetDefault after New applies); pass watermill.NopLogger{} to
	// discard.
	Logger watermill.LoggerAdapter

	// Metrics receives every outcome and store latency. The default
	// discards them; see the prommetrics package.
	Metrics Metrics

	// Tuning holds settings that rarely need changing.
	Tuning Tuning
}

// Tuning holds the middleware settings that rarely need changing. The
// zero value of each field means its documented default.
type Tuning struct {
	// Heartbeat is how often a running handler's lease is extended. The
	// default is Lease/3; a negative value disables extension (a handler
	// running longer than Lease may then be taken over).
	Heartbeat time.Duration

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

	// InProgressPoll is how often a delivery waiting for another
	// consumer's run (Config.InProgressWait) claims again. The default is
	// 100ms.
	InProgressPoll time.Duration
}

// Errors returned by the middleware and by New. Errors of the store
// (stores.ErrLostClaim, ...) and of key functions (keyfuncs.ErrNoKey) are
// wrapped, so errors.Is finds them too. Every error the middleware
// returns starts with "dedup: ".
var (
	// ErrInvalidConfig is wrapped by every error of Config.Validate.
	ErrInvalidConfig = errors.New("dedup: invalid config")

	// ErrRetentionTooShort is wrapped by the error of CheckRetention.
	ErrRetentionTooShort = errors.New("dedup: retention shorter than the redelivery horizon allows")

	// ErrInProgress is returned for a delivery whose keys another consumer
	// is processing. It is retryable: the message is nacked, not lost.
	ErrInProgress = errors.New("dedup: message is being processed by another consumer")

	// ErrStore wraps a failed store call that nacks the message: a Claim
	// or Begin that failed (under FailClosed, or for any error but an
	// outage under FailOpen), so the handler did not run, or a Commit.
	ErrStore = errors.New("dedup: store call failed")

	// ErrFingerprintMismatch reports a duplicate whose key was recorded
	// with a different Config.Fingerprint: the same key reused for other
	// content. It is permanent (see IsPermanent).
	ErrFingerprintMismatch = errors.New("dedup: key reused with a different payload fingerprint")

	// ErrCorruptRecord reports stored data the middleware cannot decode.
	ErrCorruptRecord = errors.New("dedup: corrupt stored record data")
)

// Validate reports the first invalid field, naming it and the bound.
func (c Config) Validate() error {
	t := c.Tuning
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	case c.Mode > ModeTransactional:
		return fmt.Errorf("%w: Mode must be ModeLease, ModeAsyncComplete or ModeTransactional, got %s", ErrInvalidConfig, c.Mode)
	case c.Lease < 0:
		return fmt.Errorf("%w: Lease must not be negative, got %s", ErrInvalidConfig, c.Lease)
	case c.Retention < 0:
		return fmt.Errorf("%w: Retention must not be negative, got %s", ErrInvalidConfig, c.Retention)
	case c.StoreTimeout < 0:
		return fmt.Errorf("%w: StoreTimeout must not be negative, got %s", ErrInvalidConfig, c.StoreTimeout)
	case c.InProgressWait < 0:
		return fmt.Errorf("%w: InProgressWait must not be negative, got %s", ErrInvalidConfig, c.InProgressWait)
	case c.OnStoreError > FailOpen:
		return fmt.Errorf("%w: OnStoreError must be FailClosed or FailOpen, got %s", ErrInvalidConfig, c.OnStoreError)
	case t.CompleteTimeout < 0:
		return fmt.Errorf("%w: Tuning.CompleteTimeout must not be negative, got %s", ErrInvalidConfig, t.CompleteTimeout)
	case t.InProgressPoll < 0:
		return fmt.Errorf("%w: Tuning.InProgressPoll must not be negative, got %s", ErrInvalidConfig, t.InProgressPoll)
	}
	lease := c.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	if t.Heartbeat > 0 && t.Heartbeat >= lease {
		return fmt.Errorf("%w: Tuning.Heartbeat (%s) must be shorter than Lease (%s)", ErrInvalidConfig, t.Heartbeat, lease)
	}
	if c.Mode == ModeTransactional {
		if _, ok := c.Store.(stores.Inbox); !ok {
			return fmt.Errorf("%w: ModeTransactional needs a Store implementing stores.Inbox (such as sqlstore); %T does not", ErrInvalidConfig, c.Store)
		}
		if c.OnStoreError == FailOpen {
			return fmt.Errorf("%w: FailOpen cannot be combined with ModeTransactional (the handler's writes need the store's database)", ErrInvalidConfig)
		}
	}
	return nil
}

// CheckRetention reports whether a retention window covers a broker's
// redelivery horizon — the longest time after which the broker may still
// redeliver a message: SQS maxReceiveCount x visibility timeout, the
// consumer outage budget for RabbitMQ, the group recovery time for Kafka
// — with the RetentionSafetyFactor margin. It returns nil, or an error
// wrapping ErrRetentionTooShort that names the minimum. A zero retention
// means DefaultRetention; a zero horizon (unknown) is never too long.
//
// Call it at start-up with Config.Retention, and log the error or refuse
// to start: a redelivery arriving after the window is processed again
// (counted as OutcomeTTLMiss when Config.PublishedAt is set).
func CheckRetention(retention, horizon time.Duration) error {
	if retention == 0 {
		retention = DefaultRetention
	}
	if horizon <= 0 {
		return nil
	}
	minimum := time.Duration(math.MaxInt64) // 1.3 x a horizon this long is no duration
	if f := float64(horizon) * RetentionSafetyFactor; f < math.MaxInt64 {
		minimum = time.Duration(f)
	}
	if retention < minimum {
		return fmt.Errorf("%w: retention %s < %.1f x redelivery horizon %s = %s: redeliveries after the window are processed again", ErrRetentionTooShort, retention, RetentionSafetyFactor, horizon, minimum)
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
	if c.Tuning.Heartbeat == 0 {
		c.Tuning.Heartbeat = c.Lease / 3
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.Tuning.CompleteTimeout == 0 {
		c.Tuning.CompleteTimeout = c.Lease
	}
	if c.Tuning.InProgressPoll == 0 {
		c.Tuning.InProgressPoll = DefaultInProgressPoll
	}
	if c.Logger == nil {
		c.Logger = slogDefault{}
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
