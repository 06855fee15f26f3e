package publisher

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// Mode is how the publisher records a message published.
type Mode uint8

const (
	// ModeLease (the default) claims a message's keys under a lease,
	// publishes it, and records it done (Complete) once the publish
	// returned. It works with every store and every publisher.
	ModeLease Mode = iota

	// ModeTransactional writes the record in the caller's database
	// transaction, beside the rows a transactional publisher (watermill-sql
	// on the same transaction: the outbox pattern) writes for the message.
	// Store must implement stores.Inbox and stores.TxJoiner (sqlstore does),
	// and every message's context must carry the transaction
	// (sqlstore.WithTx), the same for every message of a call; a message
	// without it fails the call with ErrNoTransaction and nothing is
	// published. Record and outbox row
	// commit or roll back together, so the event enters the outbox once,
	// whatever crashes. There is no lease: a concurrent publish of the
	// same key waits on the record until the first transaction ends.
	ModeTransactional
)

// String returns "lease" or "transactional".
func (m Mode) String() string {
	switch m {
	case ModeLease:
		return "lease"
	case ModeTransactional:
		return "transactional"
	default:
		return fmt.Sprintf("Mode(%d)", uint8(m))
	}
}

// Default values of Config fields.
const (
	// DefaultWindow is how long a published message's record is kept: the
	// deduplication window of SQS FIFO queues.
	DefaultWindow = 5 * time.Minute
	// DefaultLease bounds how long a producer that died between its
	// publish and the record keeps the message's keys.
	DefaultLease = 30 * time.Second
	// DefaultScopePrefix starts the default scope, which is the prefix
	// and the topic.
	DefaultScopePrefix = "publish:"
	// DefaultInProgressPoll is how often a publish waiting for another
	// producer's publish of the same keys claims again.
	DefaultInProgressPoll = 50 * time.Millisecond
)

// Config configures a Decorator. The zero value of every field but Store
// means its documented default.
type Config struct {
	// Store keeps the records. Required. Producers sharing a store (and a
	// scope) publish each message once between them.
	Store stores.Store

	// Mode is ModeLease (the default) or ModeTransactional.
	Mode Mode

	// Key builds the keys a message claims. The default is
	// keyfuncs.MessageID(), which catches a producer retrying the same
	// *message.Message; a producer that builds a new message (a new UUID)
	// for each attempt needs a business key (keyfuncs.JSON,
	// keyfuncs.Metadata) or keyfuncs.PayloadSHA256().
	Key keyfuncs.KeyFunc

	// Scope separates the records of different publishers. The default is
	// DefaultScopePrefix followed by the topic, so the same key published
	// to two topics is published to each once.
	Scope string

	// Window is how long a published message's record is kept: a message
	// published again within it is not published; after it, it is. The
	// default is DefaultWindow (5m).
	Window time.Duration

	// Lease is how long a claim holds a message's keys while it is being
	// published (ModeLease). A producer that dies between its publish and
	// the record leaves the keys held this long; a retry after it publishes
	// again. The lease is not extended while the decorated publisher runs:
	// a publish call that outlasts it lets another producer take the keys
	// over and publish the message again. Keep it well above the longest
	// publish call (the publisher's own timeouts and retries included).
	// The default is 30s.
	Lease time.Duration

	// StoreTimeout bounds every store call but the Begin of
	// ModeTransactional, which the message's context bounds: it works in
	// the caller's transaction and waits there for a concurrent
	// transaction that published the same key to end (a statement
	// cancelled by a timeout would end the caller's connection). The
	// default is middleware.DefaultStoreTimeout (5s).
	StoreTimeout time.Duration

	// OnStoreError is the policy when a Claim fails because the store is
	// unavailable: middleware.FailClosed (the default) returns an error
	// wrapping middleware.ErrStore and publishes nothing; FailOpen
	// publishes unprotected, counted (OutcomeBypassed) and logged. Only
	// outages are bypassed, as in the middleware. FailOpen cannot be
	// combined with ModeTransactional.
	OnStoreError middleware.StoreErrorPolicy

	// InProgressWait is how long a publish whose keys another producer is
	// publishing waits for that publish to finish (claiming again every
	// InProgressPoll): when it completes the message is a duplicate, when
	// it fails the message is claimed and published. The default, zero,
	// returns ErrInProgress at once.
	InProgressWait time.Duration

	// InProgressPoll is how often a waiting publish claims again. The
	// default is DefaultInProgressPoll.
	InProgressPoll time.Duration

	// Logger receives every message the publisher fails for good, every
	// bypass, and every record it could not write. The default is
	// middleware.DefaultLogger(); pass watermill.NopLogger{} to discard.
	Logger watermill.LoggerAdapter

	// Metrics receives every outcome and store latency, under the scope:
	// OutcomeClaimed for a message published under a claim,
	// OutcomeDuplicate for one not published, OutcomeReleased for a claim
	// released after a failed publish, and the middleware's OutcomeNoKey,
	// OutcomeInProgress, OutcomeStoreError, OutcomeBypassed and
	// OutcomeCancelled. prommetrics works for both sides. The default
	// discards them.
	Metrics middleware.Metrics
}

// Errors returned by the publisher. Errors of the store, of the key
// function and of the decorated publisher are wrapped, so errors.Is finds
// them too (middleware.ErrStore, keyfuncs.ErrNoKey, ...).
var (
	// ErrInProgress is returned by a Publish whose message another
	// producer is publishing (its claim is live). Nothing was published;
	// retry later.
	ErrInProgress = errors.New("dedup: message is being published by another producer")

	// ErrNoTransaction is returned in ModeTransactional for a message whose
	// context carries no transaction for the store to join. Nothing was
	// published.
	ErrNoTransaction = errors.New("dedup: the message's context carries no transaction (set it with sqlstore.WithTx)")
)

// Validate reports the first invalid field, naming it and the bound. Its
// errors wrap middleware.ErrInvalidConfig.
func (c Config) Validate() error {
	bad := middleware.ErrInvalidConfig
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", bad)
	case c.Mode > ModeTransactional:
		return fmt.Errorf("%w: Mode must be ModeLease or ModeTransactional, got %s", bad, c.Mode)
	case c.Window < 0:
		return fmt.Errorf("%w: Window must not be negative, got %s", bad, c.Window)
	case c.Lease < 0:
		return fmt.Errorf("%w: Lease must not be negative, got %s", bad, c.Lease)
	case c.StoreTimeout < 0:
		return fmt.Errorf("%w: StoreTimeout must not be negative, got %s", bad, c.StoreTimeout)
	case c.InProgressWait < 0:
		return fmt.Errorf("%w: InProgressWait must not be negative, got %s", bad, c.InProgressWait)
	case c.InProgressPoll < 0:
		return fmt.Errorf("%w: InProgressPoll must not be negative, got %s", bad, c.InProgressPoll)
	case c.OnStoreError > middleware.FailOpen:
		return fmt.Errorf("%w: OnStoreError must be FailClosed or FailOpen, got %s", bad, c.OnStoreError)
	}
	if c.Mode == ModeTransactional {
		if _, ok := c.Store.(stores.Inbox); !ok {
			return fmt.Errorf("%w: ModeTransactional needs a Store implementing stores.Inbox (such as sqlstore); %T does not", bad, c.Store)
		}
		if _, ok := c.Store.(stores.TxJoiner); !ok {
			return fmt.Errorf("%w: ModeTransactional needs a Store implementing stores.TxJoiner (such as sqlstore); %T does not", bad, c.Store)
		}
		if c.OnStoreError == middleware.FailOpen {
			return fmt.Errorf("%w: FailOpen cannot be combined with ModeTransactional (the record must commit with the outbox row)", bad)
		}
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Key == nil {
		c.Key = keyfuncs.MessageID()
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = middleware.DefaultStoreTimeout
	}
	if c.InProgressPoll == 0 {
		c.InProgressPoll = DefaultInProgressPoll
	}
	if c.Logger == nil {
		c.Logger = middleware.DefaultLogger()
	}
	if c.Metrics == nil {
		c.Metrics = middleware.NopMetrics{}
	}
}
