package dedup

import (
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"
)

// StoreErrorPolicy says what happens to a message when the store cannot be
// reached to claim it.
type StoreErrorPolicy uint8

const (
	// FailClosed (the default) returns the store error: the message is
	// nacked and redelivered later (or the publish fails), and the effect
	// does not run. Nothing is lost and nothing is doubled; the queue
	// stalls while the store is down.
	FailClosed StoreErrorPolicy = iota
	// FailOpen runs the effect unprotected when the store is down:
	// consumption (or publishing) goes on, but a duplicate delivered
	// during the outage is processed again. Every bypass is counted
	// (OutcomeBypassed) and logged with its keys, for reconciliation.
	//
	// Only an outage is bypassed: an error wrapping stores.ErrUnavailable,
	// or a Claim that outlived StoreTimeout while the message's context
	// was alive. A cancelled message, a closed store, an argument or key
	// the store refuses and an error the store does not classify are
	// handled as under FailClosed: the store may be healthy, and running
	// the effect could repeat one it has recorded. A healthy store that
	// makes a Claim wait longer than StoreTimeout (a lock held by an open
	// transaction on the same key, an exhausted connection pool) looks
	// like an outage: keep StoreTimeout above such waits. FailOpen cannot
	// be combined with ModeTransactional.
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

// Default values of Policy fields.
const (
	DefaultLease          = 30 * time.Second
	DefaultRetention      = 24 * time.Hour
	DefaultStoreTimeout   = 5 * time.Second
	DefaultInProgressPoll = 100 * time.Millisecond
	DefaultCompleteLinger = time.Millisecond
	// RetentionSafetyFactor is the margin the retention window needs over
	// the broker's maximum redelivery horizon: 30% for the redeliveries
	// that arrive late (consumer restarts, rebalances, clock skew).
	RetentionSafetyFactor = 1.3
)

// Policy holds the settings the middleware and the publisher share, with
// one name and one default each. The zero value of every field means its
// documented default.
type Policy struct {
	// Lease is how long a claim holds its keys before another consumer
	// (or producer) may take them over, presuming the holder dead. The
	// lease is extended while the effect runs (see Tuning.Heartbeat), so
	// it bounds how long a crashed process blocks a retry, not how long
	// a handler or a publish may run. The default is DefaultLease (30s).
	// Not used by ModeTransactional.
	Lease time.Duration

	// Retention is how long a done record is kept: a message delivered
	// (or published) again within it is a duplicate; after it, it runs
	// again. On the consumer side make it at least RetentionSafetyFactor x
	// the broker's maximum redelivery horizon (see CheckHorizon); on
	// the producer side, longer than the producer may retry. The default
	// is DefaultRetention (24h).
	Retention time.Duration

	// StoreTimeout bounds every store call, but a Begin that joins a
	// transaction the message's context carries (ModeTransactional): that
	// one waits, in the caller's transaction, for a concurrent
	// transaction holding the same key, and is bounded by the message's
	// context (a statement cancelled by a timeout would end the caller's
	// connection). The default is DefaultStoreTimeout (5s).
	StoreTimeout time.Duration

	// OnStoreError is the policy when a Claim fails: FailClosed (the
	// default) or FailOpen.
	OnStoreError StoreErrorPolicy

	// InProgressWait is how long a message whose keys another run holds
	// waits for that run to finish before failing with ErrInProgress.
	// While waiting it claims again every Tuning.InProgressPoll: when the
	// other run completes the message is a duplicate, when it fails the
	// message is claimed and runs. The default, zero, fails with
	// ErrInProgress at once; on the consumer side pair that with
	// Watermill's Retry middleware or the broker's redelivery delay.
	InProgressWait time.Duration

	// Logger receives what the middleware or the publisher reports:
	// every message it fails for good (no key, fingerprint mismatch,
	// corrupt record) and every bypass, takeover, ttl miss and store
	// failure. The default logs through log/slog's default logger as it
	// is at each line (so slog.SetDefault after New applies); pass
	// watermill.NopLogger{} to discard.
	Logger watermill.LoggerAdapter

	// Metrics receives every outcome and store latency. The default
	// discards them; see the prommetrics package.
	Metrics Metrics

	// Tracing makes an OpenTelemetry span of every store call, when its
	// Provider is set. The default is no tracing.
	Tracing Tracing

	// Tuning holds settings that rarely need changing.
	Tuning Tuning
}

// Tracing configures the spans of the store calls: one span per call
// (dedup.claim, dedup.complete, dedup.release, dedup.extend,
// dedup.begin, dedup.commit, dedup.rollback), a child of the span in the
// message's context, with the attributes a dashboard groups by:
// dedup.outcome (on a claim: claimed, takeover, duplicate, in_progress,
// or what a failure meant: store_error, bypassed, cancelled, no_key),
// dedup.scope, dedup.keys.count, dedup.store (the store's kind),
// dedup.mode, dedup.side (consumer or producer), and on a duplicate
// dedup.record.age (seconds since the record was completed, when the run
// that completed it was traced). A failed call has status Error and the
// error recorded.
type Tracing struct {
	// Provider makes the tracer: otel.GetTracerProvider() for the global
	// one. Nil (the default) turns tracing off: no span is made.
	Provider trace.TracerProvider

	// RecordKeys puts the message's keys verbatim on its spans
	// (dedup.keys). Off by default: keys are often personal data (an
	// order id, an e-mail address) that a tracing backend should not
	// keep.
	RecordKeys bool

	// LinkRuns links the spans of a message's later runs to its earlier
	// ones: the span context of the message's span (the one in the
	// context the middleware or the publisher is handed, which covers the
	// whole run) is kept with the message's records, and a span link
	// leads from a duplicate's dedup.claim span to the run that completed
	// the message (dedup.link=original), from a takeover's to the run
	// whose lease expired (dedup.link=expired), from an in-progress
	// claim's to the run holding the keys (dedup.link=holder), and from a
	// Complete refused as a lost claim to the run that took the message
	// over or completed it (dedup.link=taker). It costs 25 bytes (trace
	// id, span id, trace flags) on every done record, on top of the few
	// bytes of its completion time, and 25 on every processing record
	// of a store that keeps owners (stores.OwnerClaimer; takeover, holder
	// and taker links need one). A message without a valid span in its
	// context keeps nothing. Off by default; ignored without Provider.
	// Turn it on once every process of the scope reads what it keeps
	// (see the README's Tracing section). On sqlstore, claims that keep
	// an owner run unbatched.
	LinkRuns bool
}

// Tuning holds the settings that rarely need changing. The zero value of
// each field means its documented default.
type Tuning struct {
	// Heartbeat is how often the lease of a running effect is extended.
	// The default is Lease/3; a negative value disables extension (an
	// effect running longer than Lease may then be taken over).
	Heartbeat time.Duration

	// CompleteTimeout is how long recording a message done after its
	// effect is retried (with a doubling backoff, the lease kept alive
	// meanwhile) when it fails for any reason not known to be permanent:
	// an outage, a server failing over, an error the store does not
	// classify. Then the middleware acks the message anyway (and the
	// publisher returns success) — its effect happened; the record stays
	// processing until its lease runs out. A claim found lost, a closed
	// store and an argument or data the store refuses are not retried
	// (see the README's failure table). A store failure shorter than this
	// loses nothing and doubles nothing, even when the message's context
	// ends meanwhile (an outer Timeout middleware, a subscriber shutting
	// down): the retries go on, so a router closing during an outage
	// waits up to this long for such a handler. The default is Lease.
	CompleteTimeout time.Duration

	// InProgressPoll is how often a message waiting for another run
	// (Policy.InProgressWait) claims again, give or take half of it (a
	// random spread, so that waiting producers do not claim in step).
	// The default is DefaultInProgressPoll (100ms).
	InProgressPoll time.Duration

	// CompleteLinger is how long a background Complete (the middleware's
	// ModeAsyncComplete) may wait, on a store that batches its calls
	// (redisstore, sqlstore), to go out in one round trip with the next
	// store call instead of in one of its own: on a sequential consumer
	// the record of one message then goes out with the claim of the
	// next, which halves the round trips and the CPU they cost on both
	// sides (see stores.WithLinger): where the consumer's CPU is the
	// bound, the rate rises by half or more (BENCHMARKS.md). A consumer
	// that waits for its broker with CPU to spare gains little, since
	// the Complete overlapped with that wait before. The message was
	// acked already; the record stays processing (and a duplicate waits
	// for it) up to this much longer. It must be shorter than Lease and
	// StoreTimeout (a Complete waiting for company is bounded by
	// StoreTimeout too). The default is DefaultCompleteLinger (1ms), or
	// Lease/10 or StoreTimeout/10 if shorter; a negative value sends each
	// Complete at once.
	CompleteLinger time.Duration
}

// Validate reports the first invalid field, naming it and the bound. Its
// errors wrap ErrInvalidConfig.
func (p Policy) Validate() error {
	t := p.Tuning
	switch {
	case p.Lease < 0:
		return fmt.Errorf("%w: Lease must not be negative, got %s", ErrInvalidConfig, p.Lease)
	case p.Retention < 0:
		return fmt.Errorf("%w: Retention must not be negative, got %s", ErrInvalidConfig, p.Retention)
	case p.StoreTimeout < 0:
		return fmt.Errorf("%w: StoreTimeout must not be negative, got %s", ErrInvalidConfig, p.StoreTimeout)
	case p.InProgressWait < 0:
		return fmt.Errorf("%w: InProgressWait must not be negative, got %s", ErrInvalidConfig, p.InProgressWait)
	case p.OnStoreError > FailOpen:
		return fmt.Errorf("%w: OnStoreError must be FailClosed or FailOpen, got %s", ErrInvalidConfig, p.OnStoreError)
	case t.CompleteTimeout < 0:
		return fmt.Errorf("%w: Tuning.CompleteTimeout must not be negative, got %s", ErrInvalidConfig, t.CompleteTimeout)
	case t.InProgressPoll < 0:
		return fmt.Errorf("%w: Tuning.InProgressPoll must not be negative, got %s", ErrInvalidConfig, t.InProgressPoll)
	}
	d := p.WithDefaults()
	if t.Heartbeat >= d.Lease { // a zero or negative Heartbeat is the default or none
		return fmt.Errorf("%w: Tuning.Heartbeat (%s) must be shorter than Lease (%s)", ErrInvalidConfig, t.Heartbeat, d.Lease)
	}
	if bound := min(d.Lease, d.StoreTimeout); t.CompleteLinger >= bound { // likewise
		return fmt.Errorf("%w: Tuning.CompleteLinger (%s) must be shorter than Lease (%s) and StoreTimeout (%s)", ErrInvalidConfig, t.CompleteLinger, d.Lease, d.StoreTimeout)
	}
	return nil
}

// WithDefaults returns p with every zero field set to its default.
func (p Policy) WithDefaults() Policy {
	if p.Lease == 0 {
		p.Lease = DefaultLease
	}
	if p.Retention == 0 {
		p.Retention = DefaultRetention
	}
	if p.StoreTimeout == 0 {
		p.StoreTimeout = DefaultStoreTimeout
	}
	if p.Tuning.Heartbeat == 0 {
		p.Tuning.Heartbeat = p.Lease / 3
	}
	if p.Tuning.CompleteTimeout == 0 {
		p.Tuning.CompleteTimeout = p.Lease
	}
	if p.Tuning.InProgressPoll == 0 {
		p.Tuning.InProgressPoll = DefaultInProgressPoll
	}
	if p.Tuning.CompleteLinger == 0 {
		p.Tuning.CompleteLinger = min(DefaultCompleteLinger, p.Lease/10, p.StoreTimeout/10)
	}
	if p.Logger == nil {
		p.Logger = slogDefault{}
	}
	if p.Metrics == nil {
		p.Metrics = NopMetrics{}
	}
	return p
}

// CheckHorizon reports whether a retention window covers a broker's
// redelivery horizon — the longest time after which the broker may still
// redeliver a message: SQS maxReceiveCount x visibility timeout, the
// consumer outage budget for RabbitMQ, the group recovery time for Kafka
// — with the RetentionSafetyFactor margin. It returns nil, or an error
// wrapping ErrRetentionTooShort that names the minimum. A zero retention
// means DefaultRetention; a zero horizon (unknown) is never too long.
//
// Call it at start-up with Policy.Retention, and log the error or refuse
// to start: a redelivery arriving after the window is processed again
// (counted as OutcomeTTLMiss when the middleware's PublishedAt is set).
func CheckHorizon(retention, horizon time.Duration) error {
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
