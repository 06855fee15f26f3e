// Package middleware is the Watermill handler middleware that gives a
// router exactly-once effects on top of at-least-once brokers.
//
// For every message it runs this flow:
//
//  1. keys := Config.Key(msg). A message that cannot be keyed fails with an
//     error wrapping keyfuncs.ErrNoKey; the store is not touched. Route it to
//     a poison queue (see IsPermanent).
//  2. Claim the keys in the store, bounded by StoreTimeout. A store error
//     follows OnStoreError: FailClosed nacks, FailOpen runs unprotected.
//  3. Duplicate: ack without running the handler, re-emitting the outputs
//     stored with the record. InProgress: return ErrInProgress (nack),
//     after waiting up to InProgressWait for the other run.
//  4. Claimed: run the handler with the claim in its context, extending the
//     lease every Heartbeat.
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
// Under Config.AsyncComplete the window of the first case extends past the
// ack, until the background Complete lands. In
// transactional mode (Config.Transactional) effects written in the store's
// database are never doubled.
package middleware

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// New returns the dedup middleware for cfg. Use it with
// router.AddMiddleware or handler.AddMiddleware; place it after
// Watermill's Recoverer and PoisonQueue middlewares (inner to them) so a
// panic is seen, and a permanent error is routed, after the claim was
// released.
//
// Config.AsyncComplete needs NewMiddleware instead, for its Close.
func New(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.AsyncComplete {
		return nil, fmt.Errorf("%w: AsyncComplete needs NewMiddleware, whose Close waits for the Completes in flight", ErrInvalidConfig)
	}
	d, err := newDedup(cfg)
	if err != nil {
		return nil, err
	}
	return d.middleware, nil
}

// Middleware is the dedup middleware with a lifetime, for
// Config.AsyncComplete: Close waits for the Completes still in flight.
// Without AsyncComplete it behaves as New's middleware and Close is a
// no-op.
type Middleware struct {
	d *dedup
}

// NewMiddleware returns the dedup middleware for cfg. Add its Handler
// method with router.AddMiddleware or handler.AddMiddleware, and Close it
// once the router has stopped.
func NewMiddleware(cfg Config) (*Middleware, error) {
	d, err := newDedup(cfg)
	if err != nil {
		return nil, err
	}
	return &Middleware{d: d}, nil
}

// Handler is a message.HandlerMiddleware: it wraps h in the dedup flow.
func (m *Middleware) Handler(h message.HandlerFunc) message.HandlerFunc {
	return m.d.middleware(h)
}

// Close waits until every Complete started in the background has landed
// or given up (after CompleteTimeout), or until ctx is done: then the
// remaining retries stop, their records stay processing until their
// leases expire, and Close returns ctx's error once the store calls still
// in flight have returned (each within StoreTimeout). Messages handled
// after Close complete before they are acked, as without AsyncComplete.
// It is idempotent.
func (m *Middleware) Close(ctx context.Context) error {
	if m.d.async == nil {
		return nil
	}
	return m.d.async.close(ctx)
}

type dedup struct {
	cfg   Config
	inbox stores.Inbox // set in transactional mode
	// noTimeout: the store never blocks, so per-call timeouts are skipped.
	noTimeout bool
	// timed: Metrics wants store latencies (it is not NopMetrics).
	timed bool
	beats beats
	async *pending // set under AsyncComplete
}

func newDedup(cfg Config) (*dedup, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	d := &dedup{cfg: cfg}
	d.beats.d = d
	if nb, ok := cfg.Store.(stores.NonBlocking); ok && nb.NonBlocking() {
		d.noTimeout = true
	}
	if _, nop := cfg.Metrics.(NopMetrics); !nop {
		d.timed = true
	}
	if cfg.Transactional {
		d.inbox = cfg.Store.(stores.Inbox)
	}
	if cfg.AsyncComplete {
		d.async = newPending()
	}
	if h := cfg.RedeliveryHorizon; h > 0 {
		minimum := time.Duration(math.MaxInt64) // 1.3 x a horizon this long is no duration
		if f := float64(h) * RetentionSafetyFactor; f < math.MaxInt64 {
			minimum = time.Duration(f)
		}
		if cfg.Retention < minimum {
			if cfg.StrictRetention {
				return nil, fmt.Errorf("%w: Retention %s < %.1f x RedeliveryHorizon %s = %s", ErrRetentionTooShort, cfg.Retention, RetentionSafetyFactor, h, minimum)
			}
			cfg.Logger.Error("Dedup retention window is shorter than the broker's redelivery horizon allows: redeliveries after the window will be processed again (counted as ttl_miss)", ErrRetentionTooShort, watermill.LogFields{
				"retention": cfg.Retention.String(), "redelivery_horizon": h.String(), "minimum": minimum.String(),
			})
		}
	}
	return d, nil
}

type claimCtxKey struct{}

// ClaimFromContext returns the claim the middleware holds for the message
// whose context ctx is, in lease mode.
func ClaimFromContext(ctx context.Context) (*stores.Claim, bool) {
	c, ok := ctx.Value(claimCtxKey{}).(*stores.Claim)
	return c, ok
}

// IsPermanent reports whether err, returned by the middleware, marks bad
// input that no retry will fix: a message without a key
// (keyfuncs.ErrNoKey), a key reused with a different payload
// (stores.ErrFingerprintMismatch) or corrupt stored data. Use it as the
// filter of Watermill's PoisonQueueWithFilter.
func IsPermanent(err error) bool {
	return errors.Is(err, keyfuncs.ErrNoKey) ||
		errors.Is(err, stores.ErrFingerprintMismatch) ||
		errors.Is(err, ErrCorruptRecord)
}

func (d *dedup) scope(msg *message.Message) string {
	if d.cfg.Scope != "" {
		return d.cfg.Scope
	}
	if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
		return name
	}
	return DefaultScope
}

func (d *dedup) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		keys, err := d.cfg.Key(msg)
		scope := d.scope(msg)
		if err != nil {
			d.cfg.Metrics.Observe(scope, OutcomeNoKey)
			return nil, fmt.Errorf("dedup %s: %w", scope, err)
		}
		if len(keys) == 0 {
			d.cfg.Metrics.Observe(scope, OutcomeNoKey)
			return nil, fmt.Errorf("dedup %s: %w: message %s: the key function returned no keys", scope, keyfuncs.ErrNoKey, keyfuncs.Name(msg))
		}
		if d.inbox != nil {
			return d.handleTx(h, msg, scope, keys)
		}
		return d.handleLease(h, msg, scope, keys)
	}
}

func (d *dedup) fields(msg *message.Message, scope string, keys []string) watermill.LogFields {
	return watermill.LogFields{"message_uuid": msg.UUID, "scope": scope, "keys": keys}
}

// storeCtx bounds a store call by StoreTimeout. Calls that must happen
// after the handler (Complete, Release) detach from the message's
// cancellation first, so a cancelled message still releases its claim.
func (d *dedup) storeCtx(parent context.Context, detach bool) (context.Context, context.CancelFunc) {
	if d.noTimeout {
		// A non-blocking store needs neither a deadline nor the message's
		// cancellation; detaching is then just dropping the latter.
		if detach {
			return context.Background(), func() {}
		}
		return parent, func() {}
	}
	if detach {
		parent = context.WithoutCancel(parent)
	}
	return context.WithTimeout(parent, d.cfg.StoreTimeout)
}

// now returns the time for a store latency measurement, or the zero time
// when nobody observes latencies (time.Now is not free on a hot path).
func (d *dedup) now() time.Time {
	if !d.timed {
		return time.Time{}
	}
	return time.Now()
}

func (d *dedup) observeStore(scope, op string, start time.Time, err error) {
	if d.timed {
		d.cfg.Metrics.ObserveStore(scope, op, time.Since(start), err)
	}
}

func (d *dedup) claim(parent context.Context, scope string, keys []string) (*stores.Claim, error) {
	ctx, cancel := d.storeCtx(parent, false)
	defer cancel()
	start := d.now()
	c, err := d.cfg.Store.Claim(ctx, scope, keys, d.cfg.Lease)
	d.observeStore(scope, OpClaim, start, err)
	return c, err
}

func (d *dedup) handleLease(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	c, err := d.claim(msg.Context(), scope, keys)
	if err == nil && c.Result == stores.InProgress && d.cfg.InProgressWait > 0 {
		c, err = d.waitInProgress(msg, scope, keys)
	}
	if err != nil {
		return d.storeFailed(h, msg, scope, keys, err)
	}
	switch c.Result {
	case stores.Duplicate:
		return d.duplicate(msg, scope, keys, c.Data)
	case stores.InProgress:
		d.cfg.Metrics.Observe(scope, OutcomeInProgress)
		return nil, fmt.Errorf("%w: message %s, scope %q, keys %q", ErrInProgress, keyfuncs.Name(msg), scope, keys)
	case stores.Claimed:
	default:
		return nil, fmt.Errorf("dedup %s: store %T returned result %d", scope, d.cfg.Store, c.Result)
	}

	d.cfg.Metrics.Observe(scope, OutcomeClaimed)
	if c.Takeover {
		d.cfg.Metrics.Observe(scope, OutcomeTakeover)
		d.cfg.Logger.Info("Took over an expired dedup lease: the previous consumer may have crashed after its side effect", d.fields(msg, scope, keys))
	}
	d.checkTTL(msg, scope, keys)

	return d.runClaimed(h, msg, c)
}

// waitInProgress re-claims every InProgressPoll until the keys are no
// longer in progress or InProgressWait has passed.
func (d *dedup) waitInProgress(msg *message.Message, scope string, keys []string) (*stores.Claim, error) {
	deadline := time.NewTimer(d.cfg.InProgressWait)
	defer deadline.Stop()
	poll := time.NewTicker(d.cfg.InProgressPoll)
	defer poll.Stop()
	for {
		select {
		case <-deadline.C:
			return &stores.Claim{Scope: scope, Keys: keys, Result: stores.InProgress}, nil
		case <-msg.Context().Done():
			return &stores.Claim{Scope: scope, Keys: keys, Result: stores.InProgress}, nil
		case <-poll.C:
			c, err := d.claim(msg.Context(), scope, keys)
			if err != nil || c.Result != stores.InProgress {
				return c, err
			}
		}
	}
}

// storeFailed handles a Claim (or Begin) that failed, by the class of its
// error (see the stores package doc): a key the store refuses is bad input
// (permanent); a message whose context ended is nacked (cancelled); an
// outage is bypassed under FailOpen; everything else — a closed store,
// a refused argument, an error the store does not classify, a dead outer
// transaction — is nacked under either policy, since the store is not
// known to be unreachable and running the handler unprotected could
// repeat a done effect.
func (d *dedup) storeFailed(h message.HandlerFunc, msg *message.Message, scope string, keys []string, err error) ([]*message.Message, error) {
	if errors.Is(err, stores.ErrInvalidKey) {
		// A key function returned something the store rejects: bad input,
		// not an outage.
		d.cfg.Metrics.Observe(scope, OutcomeNoKey)
		return nil, fmt.Errorf("dedup %s: %w: message %s: %w", scope, keyfuncs.ErrNoKey, keyfuncs.Name(msg), err)
	}
	if cerr := msg.Context().Err(); cerr != nil {
		d.cfg.Metrics.Observe(scope, OutcomeCancelled)
		return nil, fmt.Errorf("dedup %s: message %s: its context ended before the store answered: %w", scope, keyfuncs.Name(msg), errors.Join(cerr, err))
	}
	d.cfg.Metrics.Observe(scope, OutcomeStoreError)
	if d.cfg.OnStoreError == FailOpen && isOutage(err) {
		d.cfg.Metrics.Observe(scope, OutcomeBypassed)
		f := d.fields(msg, scope, keys)
		f["error"] = err.Error()
		d.cfg.Logger.Error("Dedup store unavailable: running the handler UNPROTECTED (fail-open); reconcile these keys", err, f)
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
func (d *dedup) duplicate(msg *message.Message, scope string, keys []string, data []byte) ([]*message.Message, error) {
	fp, outputs, err := decodeData(data)
	if err != nil {
		return nil, fmt.Errorf("dedup %s: message %s: %w", scope, keyfuncs.Name(msg), err)
	}
	if d.cfg.Fingerprint != nil && len(fp) > 0 {
		if got := d.cfg.Fingerprint(msg); string(got) != string(fp) {
			d.cfg.Metrics.Observe(scope, OutcomeFingerprintMismatch)
			return nil, fmt.Errorf("dedup %s: message %s, keys %q: %w", scope, keyfuncs.Name(msg), keys, stores.ErrFingerprintMismatch)
		}
	}
	d.cfg.Metrics.Observe(scope, OutcomeDuplicate)
	return outputs, nil
}

func (d *dedup) checkTTL(msg *message.Message, scope string, keys []string) {
	if d.cfg.PublishedAt == nil {
		return
	}
	at, ok := d.cfg.PublishedAt(msg)
	if !ok {
		return
	}
	if age := time.Since(at); age > d.cfg.Retention {
		d.cfg.Metrics.Observe(scope, OutcomeTTLMiss)
		f := d.fields(msg, scope, keys)
		f["age"] = age.String()
		f["retention"] = d.cfg.Retention.String()
		d.cfg.Logger.Error("Message is older than the dedup retention window: if it was handled before, its record has expired and it runs again (ttl_miss)", nil, f)
	}
}

// runClaimed runs the handler under a heartbeat, then completes the
// claim, or releases it when the handler fails or panics. The heartbeat
// runs until Complete or Release is done, so a Complete retried through a
// store outage keeps its lease.
func (d *dedup) runClaimed(h message.HandlerFunc, msg *message.Message, c *stores.Claim) (outputs []*message.Message, err error) {
	parent := msg.Context()
	// The beat is also the handler's context: one allocation carries the
	// claim (Value), the heartbeat state and, when first needed, the
	// cancellation.
	hb := &beat{c: c, parent: parent}
	msg.SetContext(hb)
	d.beats.add(hb)

	settled := false
	defer func() {
		if settled {
			return
		}
		// A handler error, or a panic going on up to the router's
		// Recoverer after the release.
		d.beats.remove(hb)
		hb.finish()
		msg.SetContext(parent)
		d.release(parent, c)
	}()
	outputs, err = h(msg)
	if err != nil {
		return nil, err
	}
	msg.SetContext(parent)
	// Encoded now, before outer middlewares (or the router) touch the
	// outputs, and before settled: a panicking Fingerprint releases the
	// claim like a panicking handler.
	data := d.encode(msg, outputs)
	settled = true
	hb.completing.Store(true)
	if d.async != nil && d.async.start() {
		go func() {
			defer d.async.done()
			d.completeAsync(parent, msg, c, data)
			d.beats.remove(hb)
			hb.finish()
		}()
		return outputs, nil
	}
	outputs, err = d.complete(msg, c, data, outputs)
	d.beats.remove(hb)
	hb.finish()
	return outputs, err
}

func (d *dedup) encode(msg *message.Message, outputs []*message.Message) []byte {
	var fp []byte
	if d.cfg.Fingerprint != nil {
		fp = d.cfg.Fingerprint(msg)
	}
	return encodeData(fp, outputs)
}

func (d *dedup) release(parent context.Context, c *stores.Claim) {
	ctx, cancel := d.storeCtx(parent, true)
	defer cancel()
	start := d.now()
	err := d.cfg.Store.Release(ctx, c)
	d.observeStore(c.Scope, OpRelease, start, err)
	switch {
	case err == nil:
		d.cfg.Metrics.Observe(c.Scope, OutcomeReleased)
	case errors.Is(err, stores.ErrLostClaim):
		d.cfg.Metrics.Observe(c.Scope, OutcomeLostClaim)
	default:
		// The record stays processing until its lease runs out; then a
		// redelivery takes it over. Nothing is lost, only delayed.
		d.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
		d.cfg.Logger.Error("Dedup release failed: the message will be retried after the lease expires", err, watermill.LogFields{"scope": c.Scope, "keys": c.Keys})
	}
}

// record stores data on the claim's records. Store errors are retried
// with a doubling backoff for up to CompleteTimeout, while the heartbeat
// (still registered) keeps the lease: a store outage shorter than that
// loses nothing and doubles nothing. The backoff ends early only when
// wait is done (Close giving up on background Completes). Each call
// detaches from parent's cancellation if detach is set.
// It returns nil, an error wrapping stores.ErrLostClaim, or the last store
// error.
func (d *dedup) record(parent, wait context.Context, detach bool, c *stores.Claim, data []byte) error {
	var deadline time.Time // from the first failure: a clock read is not free
	backoff := 20 * time.Millisecond
	for {
		ctx, cancel := d.storeCtx(parent, detach)
		start := d.now()
		err := d.cfg.Store.Complete(ctx, c, d.cfg.Retention, data)
		cancel()
		d.observeStore(c.Scope, OpComplete, start, err)
		if err == nil || errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) {
			return err
		}
		if !isOutage(err) {
			// A refusal no retry changes (the data too large for the
			// store, say).
			return d.recordWithoutData(parent, detach, c, data, err)
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(d.cfg.CompleteTimeout)
		}
		if now.Add(backoff).After(deadline) || !sleepCtx(wait, backoff) {
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// recordWithoutData handles a Complete refused with refusal, an error
// that is not an outage: when it carried data, the store may have refused
// that (outputs too large to keep), so the record is completed once more
// without it. A record done without its outputs is better than one left
// processing, which a duplicate arriving after the lease would run again;
// the price is loud: a redelivery after a failed publish of the outputs
// acks without re-emitting them.
func (d *dedup) recordWithoutData(parent context.Context, detach bool, c *stores.Claim, data []byte, refusal error) error {
	if len(data) == 0 {
		return refusal
	}
	ctx, cancel := d.storeCtx(parent, detach)
	start := d.now()
	err := d.cfg.Store.Complete(ctx, c, d.cfg.Retention, nil)
	cancel()
	d.observeStore(c.Scope, OpComplete, start, err)
	if err != nil {
		return refusal
	}
	d.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
	d.cfg.Logger.Error("Dedup store refused the record's data (the handler's outputs and fingerprint): the message is recorded done without them, so a redelivery after a failed publish of its outputs will not re-emit them", refusal, watermill.LogFields{"scope": c.Scope, "keys": c.Keys, "data_bytes": len(data)})
	return nil
}

// complete records the message done with its outputs, and returns what
// the middleware returns to the router.
func (d *dedup) complete(msg *message.Message, c *stores.Claim, data []byte, outputs []*message.Message) ([]*message.Message, error) {
	// Retried for CompleteTimeout whatever becomes of the message's
	// context: its effect happened, and giving up early would leave the
	// record processing for a later duplicate to run again.
	err := d.record(msg.Context(), context.WithoutCancel(msg.Context()), true, c, data)
	if err == nil {
		return outputs, nil
	}
	if errors.Is(err, stores.ErrLostClaim) {
		return d.reconcile(msg.Context(), msg, c, data, outputs, err)
	}
	// The effect happened; nacking now would run it again once the lease
	// expires. Ack instead: the record stays processing until its lease
	// runs out, so only a further duplicate arriving after that runs again.
	d.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
	d.cfg.Logger.Error("Dedup Complete failed (for CompleteTimeout, or refused): acking anyway (the effect happened); a duplicate arriving after the lease expires would run again", err, d.fields(msg, c.Scope, c.Keys))
	return outputs, nil
}

// completeAsync is complete for a message already acked (AsyncComplete):
// the subscriber may have cancelled its context, so every call detaches
// from it, and a failure can only be reported.
//
// msgCtx is the message's context as the handler got it: the message
// itself belongs to the router again, which may set another.
func (d *dedup) completeAsync(msgCtx context.Context, msg *message.Message, c *stores.Claim, data []byte) {
	// Detached from the message, whose subscriber may cancel it after the
	// ack, but stopped by a Close that gives up waiting.
	parent, cancel := context.WithCancel(context.WithoutCancel(msgCtx))
	defer cancel()
	defer context.AfterFunc(d.async.stop, cancel)()
	err := d.record(parent, parent, false, c, data)
	switch {
	case err == nil:
	case errors.Is(err, stores.ErrLostClaim):
		// The message is acked either way; reconcile records this run
		// when the record is gone and logs a takeover.
		_, _ = d.reconcile(parent, msg, c, data, nil, err)
	default:
		d.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
		d.cfg.Logger.Error("Dedup asynchronous Complete failed (the message was acked): its record stays processing until the lease expires, and a duplicate arriving after that would run again", err, d.fields(msg, c.Scope, c.Keys))
	}
}

// reconcile decides what a refused Complete means by claiming the keys
// again. The refusal has three causes, told apart by the claim:
//   - Duplicate: the record is done — by an earlier attempt of this
//     Complete whose reply was lost, or by a consumer that took the message
//     over. Ack, with the outputs that were recorded.
//   - Claimed: the record is gone (the store lost it). Record this run.
//   - InProgress: another consumer took the message over and is running
//     it. Nack: the redelivery will find that run's outcome.
func (d *dedup) reconcile(parent context.Context, msg *message.Message, c *stores.Claim, data []byte, outputs []*message.Message, lost error) ([]*message.Message, error) {
	again, err := d.claim(parent, c.Scope, c.Keys)
	if err == nil {
		switch again.Result {
		case stores.Duplicate:
			if _, recorded, derr := decodeData(again.Data); derr == nil {
				return recorded, nil
			}
		case stores.Claimed:
			ctx, cancel := d.storeCtx(parent, true)
			err = d.cfg.Store.Complete(ctx, again, d.cfg.Retention, data)
			cancel()
			if err == nil {
				return outputs, nil
			}
			d.release(parent, again)
		}
	}
	// Our lease expired and another consumer took the message over: its
	// run will complete (or release) the record. Nack, so the redelivery
	// finds its outcome — acking here could publish a second, different
	// set of outputs.
	d.cfg.Metrics.Observe(c.Scope, OutcomeLostClaim)
	d.cfg.Logger.Error("Dedup claim lost before Complete: the lease expired while the handler ran and another consumer took over (the effect may be doubled)", lost, d.fields(msg, c.Scope, c.Keys))
	return nil, fmt.Errorf("dedup %s: message %s: %w", c.Scope, keyfuncs.Name(msg), lost)
}

// sleepCtx sleeps for d, or until ctx is done (then it returns false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// handleTx is the transactional inbox flow: the record is inserted in a
// database transaction that the handler writes its effects in.
func (d *dedup) handleTx(h message.HandlerFunc, msg *message.Message, scope string, keys []string) (outputs []*message.Message, err error) {
	parent := msg.Context()
	start := d.now()
	// StoreTimeout bounds Begin, including a wait for a concurrent
	// transaction holding the same key: that duplicate is then nacked,
	// and finds the other run's outcome when it is redelivered.
	bctx, cancel := d.storeCtx(parent, false)
	tx, err := d.inbox.Begin(bctx, scope, keys, d.cfg.Retention)
	cancel()
	d.observeStore(scope, OpBegin, start, err)
	if err != nil {
		return d.storeFailed(h, msg, scope, keys, err)
	}
	switch tx.Result() {
	case stores.Duplicate:
		return d.duplicate(msg, scope, keys, tx.Data())
	case stores.InProgress:
		d.cfg.Metrics.Observe(scope, OutcomeInProgress)
		return nil, fmt.Errorf("%w: message %s, scope %q, keys %q", ErrInProgress, keyfuncs.Name(msg), scope, keys)
	case stores.Claimed:
	default:
		_ = tx.Rollback(context.WithoutCancel(parent))
		return nil, fmt.Errorf("dedup %s: inbox %T returned result %s", scope, d.inbox, tx.Result())
	}
	d.cfg.Metrics.Observe(scope, OutcomeClaimed)
	d.checkTTL(msg, scope, keys)

	msg.SetContext(tx.Context(parent))
	committed := false
	defer func() {
		msg.SetContext(parent)
		if committed {
			return
		}
		ctx, cancel := d.storeCtx(parent, true)
		defer cancel()
		start := d.now()
		rerr := tx.Rollback(ctx)
		d.observeStore(scope, OpRollback, start, rerr)
		d.cfg.Metrics.Observe(scope, OutcomeReleased)
		if rerr != nil {
			d.cfg.Logger.Error("Dedup inbox rollback failed", rerr, d.fields(msg, scope, keys))
		}
	}()
	outputs, err = h(msg)
	if err != nil {
		return nil, err
	}
	var fp []byte
	if d.cfg.Fingerprint != nil {
		fp = d.cfg.Fingerprint(msg)
	}
	start = d.now()
	cctx, cancel := d.storeCtx(parent, true)
	err = tx.Commit(cctx, encodeData(fp, outputs))
	cancel()
	d.observeStore(scope, OpCommit, start, err)
	if err != nil {
		// Not committed: neither the effect nor the record exists. Nack.
		d.cfg.Metrics.Observe(scope, OutcomeStoreError)
		return nil, fmt.Errorf("%w: commit of message %s, scope %q: %w", ErrStore, keyfuncs.Name(msg), scope, err)
	}
	committed = true
	return outputs, nil
}
