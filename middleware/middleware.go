// Package middleware is the Watermill handler middleware that gives a
// router exactly-once effects on top of at-least-once brokers.
//
// For every message it runs this flow:
//
//  1. keys := Config.Key(msg). A message that cannot be keyed fails with an
//     error wrapping keyfuncs.ErrNoKey; the store is not touched. It is
//     logged at error level and counted (OutcomeNoKey); route it to a
//     poison queue (see IsPermanent).
//  2. Claim the keys in the store, bounded by StoreTimeout. A store error
//     follows OnStoreError: FailClosed nacks, FailOpen runs unprotected
//     through an outage.
//  3. Duplicate: ack without running the handler, re-emitting the outputs
//     stored with the record. InProgress: return ErrInProgress (nack),
//     after waiting up to InProgressWait for the other run.
//  4. Claimed: run the handler with the claim in its context, extending the
//     lease every Tuning.Heartbeat.
//  5. Handler error or panic: Release the claim, then return the error (or
//     re-panic) so the message is nacked and can be retried.
//  6. Success: Complete the record, storing the handler's produced messages
//     with it, then return them for the router to publish.
//
// # Produced messages
//
// Watermill publishes a handler's produced messages after the middleware
// chain returns, and nacks the message if that publish fails. The record is
// already done by then, so the redelivery is a duplicate — and its outputs
// would be lost. This middleware keeps the outputs in the record and returns
// them again on every duplicate delivery, with the same UUIDs: outputs are
// published at least once, and a downstream consumer deduplicating by
// message id (this middleware's default key) sees them once. This is the
// outbox idea of NServiceBus, without a second table.
//
// # Guarantees
//
// No message is acked without its effect having happened: a handler error,
// a panic, a store outage (FailClosed) or a failed publish of outputs all
// nack. In lease mode an effect runs twice only when a consumer dies
// between its side effect and Complete (the next delivery takes the lease
// over after it expires: OutcomeTakeover); when the store stays unreachable
// longer than the lease while a handler runs (the lease cannot be extended)
// or longer than CompleteTimeout after it (the message is acked with its
// record still processing, so a duplicate arriving after the lease runs
// again); or when a redelivery arrives after Retention (OutcomeTTLMiss).
// Under ModeAsyncComplete the window of the first case extends past the
// ack, until the background Complete lands. Under ModeTransactional effects
// written in the store's database are never doubled.
//
// # Files
//
// middleware.go holds the flow every mode shares (keys, scope, duplicates,
// store failures); lease.go the lease modes (claim, heartbeat, Complete,
// Release, the background Complete); transactional.go the inbox mode;
// heartbeat.go the lease extension; calls.go the bounded, timed store
// calls.
package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Middleware is the dedup middleware. Its Middleware method is the
// message.HandlerMiddleware: add it with router.AddMiddleware or
// handler.AddMiddleware, after Watermill's Recoverer and PoisonQueue
// middlewares (inner to them), so a panic is seen, and a permanent error is
// routed, after the claim was released:
//
//	dedup, err := middleware.New(middleware.Config{Store: store})
//	...
//	router.AddMiddleware(middleware.Recoverer, poisonQueue, dedup.Middleware)
//	...
//	defer dedup.Close(ctx) // after the router has stopped
//
// Close matters only for ModeAsyncComplete, whose Completes run in the
// background; in the other modes it returns at once.
type Middleware struct {
	cfg   Config
	calls storeCalls
	inbox stores.Inbox // set in ModeTransactional
	beats beats
	async *pending // set in ModeAsyncComplete
}

// New returns the dedup middleware for cfg, or an error wrapping
// ErrInvalidConfig.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	m := &Middleware{cfg: cfg, calls: newStoreCalls(cfg)}
	m.beats = beats{every: cfg.Tuning.Heartbeat, lease: cfg.Lease, calls: &m.calls, metrics: cfg.Metrics, logger: cfg.Logger}
	switch cfg.Mode {
	case ModeTransactional:
		m.inbox = cfg.Store.(stores.Inbox)
	case ModeAsyncComplete:
		m.async = newPending()
	}
	return m, nil
}

// Middleware wraps h in the dedup flow. It is a message.HandlerMiddleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		keys, err := m.cfg.Key(msg)
		scope := m.scope(msg)
		if err == nil && len(keys) == 0 {
			err = fmt.Errorf("%w: message %s: the key function returned no keys", keyfuncs.ErrNoKey, keyfuncs.Name(msg))
		}
		if err != nil {
			return nil, m.permanent(msg, scope, nil, OutcomeNoKey, fmt.Errorf("dedup: scope %q: %w", scope, err))
		}
		if m.inbox != nil {
			return m.handleTx(h, msg, scope, keys)
		}
		return m.handleLease(h, msg, scope, keys)
	}
}

// Close waits until every Complete started in the background
// (ModeAsyncComplete) has landed or given up (after
// Tuning.CompleteTimeout), or until ctx is done: then the remaining
// retries stop, their records stay processing until their leases expire,
// and Close returns ctx's error once the store calls still in flight have
// returned (each within StoreTimeout). Messages handled after Close
// complete before they are acked, as in ModeLease. In the other modes it
// returns nil at once. It is idempotent.
func (m *Middleware) Close(ctx context.Context) error {
	if m.async == nil {
		return nil
	}
	return m.async.close(ctx)
}

type claimCtxKey struct{}

// ClaimFromContext returns the claim the middleware holds for the message
// whose context ctx is, in the lease modes.
func ClaimFromContext(ctx context.Context) (*stores.Claim, bool) {
	c, ok := ctx.Value(claimCtxKey{}).(*stores.Claim)
	return c, ok
}

// IsPermanent reports whether err, returned by the middleware, marks bad
// input that no retry will fix: a message without a key
// (keyfuncs.ErrNoKey), a key reused with a different payload
// (ErrFingerprintMismatch) or corrupt stored data (ErrCorruptRecord). Use
// it as the filter of Watermill's PoisonQueueWithFilter. The middleware
// logs each such error at error level and counts it before returning it.
func IsPermanent(err error) bool {
	return errors.Is(err, keyfuncs.ErrNoKey) ||
		errors.Is(err, ErrFingerprintMismatch) ||
		errors.Is(err, ErrCorruptRecord)
}

// permanent counts and logs a message failed for good, and returns err.
// Nothing is dropped silently: whatever the router does with the error
// (a poison queue, or a nack for ever), the logger has seen it.
func (m *Middleware) permanent(msg *message.Message, scope string, keys []string, o Outcome, err error) error {
	m.cfg.Metrics.Observe(scope, o)
	f := m.fields(msg, scope, keys)
	f["outcome"] = o.String()
	m.cfg.Logger.Error("Dedup cannot process this message, and no retry will help: route it to a poison queue (middleware.IsPermanent)", err, f)
	return err
}

func (m *Middleware) scope(msg *message.Message) string {
	if m.cfg.Scope != "" {
		return m.cfg.Scope
	}
	if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
		return name
	}
	return DefaultScope
}

func (m *Middleware) fields(msg *message.Message, scope string, keys []string) watermill.LogFields {
	f := watermill.LogFields{"message_uuid": msg.UUID, "scope": scope}
	if keys != nil {
		f["keys"] = keys
	}
	return f
}

// storeFailed handles a Claim (or Begin) that failed, by the class of its
// error (see the stores package doc): a key the store refuses is bad input
// (permanent); a message whose context ended is nacked (cancelled); an
// outage is bypassed under FailOpen; everything else — a closed store,
// a refused argument, an error the store does not classify, a dead outer
// transaction — is nacked under either policy, since the store is not
// known to be unreachable and running the handler unprotected could
// repeat a done effect.
func (m *Middleware) storeFailed(h message.HandlerFunc, msg *message.Message, scope string, keys []string, err error) ([]*message.Message, error) {
	if errors.Is(err, stores.ErrInvalidKey) {
		// A key function returned something the store rejects: bad input,
		// not an outage.
		return nil, m.permanent(msg, scope, keys, OutcomeNoKey, fmt.Errorf("dedup: scope %q: %w: message %s: %w", scope, keyfuncs.ErrNoKey, keyfuncs.Name(msg), err))
	}
	if cerr := msg.Context().Err(); cerr != nil {
		m.cfg.Metrics.Observe(scope, OutcomeCancelled)
		return nil, fmt.Errorf("dedup: scope %q: message %s: its context ended before the store answered: %w", scope, keyfuncs.Name(msg), errors.Join(cerr, err))
	}
	m.cfg.Metrics.Observe(scope, OutcomeStoreError)
	if m.cfg.OnStoreError == FailOpen && isOutage(err) {
		m.cfg.Metrics.Observe(scope, OutcomeBypassed)
		f := m.fields(msg, scope, keys)
		f["error"] = err.Error()
		m.cfg.Logger.Error("Dedup store unavailable: running the handler UNPROTECTED (fail-open); reconcile these keys", err, f)
		return h(msg)
	}
	return nil, fmt.Errorf("%w: message %s, scope %q: %w", ErrStore, keyfuncs.Name(msg), scope, err)
}

// isOutage reports a store error of the outage class: the backend is
// unreachable (stores.ErrUnavailable), or a store call outlived
// StoreTimeout while the message's context was still alive.
func isOutage(err error) bool {
	return errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// duplicate acks a message that was already done, re-emitting its stored
// outputs.
func (m *Middleware) duplicate(msg *message.Message, scope string, keys []string, data []byte) ([]*message.Message, error) {
	fp, outputs, err := decodeData(data)
	if err != nil {
		return nil, m.permanent(msg, scope, keys, OutcomeCorruptRecord, fmt.Errorf("dedup: scope %q: message %s: %w", scope, keyfuncs.Name(msg), err))
	}
	if m.cfg.Fingerprint != nil && len(fp) > 0 {
		if got := m.cfg.Fingerprint(msg); string(got) != string(fp) {
			return nil, m.permanent(msg, scope, keys, OutcomeFingerprintMismatch, fmt.Errorf("%w: message %s, scope %q, keys %q", ErrFingerprintMismatch, keyfuncs.Name(msg), scope, keys))
		}
	}
	m.cfg.Metrics.Observe(scope, OutcomeDuplicate)
	return outputs, nil
}

func (m *Middleware) checkTTL(msg *message.Message, scope string, keys []string) {
	if m.cfg.PublishedAt == nil {
		return
	}
	at, ok := m.cfg.PublishedAt(msg)
	if !ok {
		return
	}
	if age := time.Since(at); age > m.cfg.Retention {
		m.cfg.Metrics.Observe(scope, OutcomeTTLMiss)
		f := m.fields(msg, scope, keys)
		f["age"] = age.String()
		f["retention"] = m.cfg.Retention.String()
		m.cfg.Logger.Error("Message is older than the dedup retention window: if it was handled before, its record has expired and it runs again (ttl_miss)", fmt.Errorf("%w: published %s ago, retention %s", errTTLMiss, age, m.cfg.Retention), f)
	}
}

func (m *Middleware) encode(msg *message.Message, outputs []*message.Message) []byte {
	var fp []byte
	if m.cfg.Fingerprint != nil {
		fp = m.cfg.Fingerprint(msg)
	}
	return encodeData(fp, outputs)
}

// errTTLMiss is the error logged with a ttl miss.
var errTTLMiss = errors.New("dedup: message older than the retention window")

// inProgress counts and returns ErrInProgress for a message whose keys
// another consumer holds.
func (m *Middleware) inProgress(msg *message.Message, scope string, keys []string) error {
	m.cfg.Metrics.Observe(scope, OutcomeInProgress)
	return fmt.Errorf("%w: message %s, scope %q, keys %q", ErrInProgress, keyfuncs.Name(msg), scope, keys)
}
