package middleware

// The lease modes, ModeLease and ModeAsyncComplete: claim the keys under a
// lease, run the handler while the heartbeat extends it, then Complete the
// record (in the background under ModeAsyncComplete), or Release it when
// the handler fails.

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

func (m *Middleware) handleLease(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	var landings uint64
	if m.async != nil {
		landings = m.async.landings.Load()
	}
	c, err := m.calls.claim(msg.Context(), scope, keys, m.cfg.Lease)
	if err == nil && c.Result == stores.InProgress && m.async != nil {
		c, err = m.awaitOwnComplete(msg, scope, keys, c, landings)
	}
	if err == nil && c.Result == stores.InProgress && m.cfg.InProgressWait > 0 {
		c, err = m.waitInProgress(msg, scope, keys)
	}
	if err != nil {
		return m.storeFailed(h, msg, scope, keys, err)
	}
	switch c.Result {
	case stores.Duplicate:
		return m.duplicate(msg, scope, keys, c.Data)
	case stores.InProgress:
		return nil, m.inProgress(msg, scope, keys)
	case stores.Claimed:
	default:
		return nil, fmt.Errorf("dedup: scope %q: store %T returned result %s", scope, m.cfg.Store, c.Result)
	}

	m.cfg.Metrics.Observe(scope, OutcomeClaimed)
	if c.Takeover {
		m.cfg.Metrics.Observe(scope, OutcomeTakeover)
		m.cfg.Logger.Info("Took over an expired dedup lease: the previous consumer may have crashed after its side effect", m.fields(msg, scope, keys))
	}
	m.checkTTL(msg, scope, keys)

	return m.runClaimed(h, msg, c)
}

// awaitOwnComplete handles keys found in progress under
// ModeAsyncComplete: when the run holding them is this middleware's own,
// acked already with its Complete on the way, the duplicate waits for that
// Complete (as ModeLease would have made the first delivery's ack wait for
// it), up to Tuning.CompleteTimeout, and claims again. Nacking it instead
// would cost the broker's redelivery delay. Keys another consumer holds
// stay in progress.
//
// landings is the count of ended background Completes before the claim
// that found the keys in progress: when it moved, one of ours may have
// landed between the store reading the record and the lookup here, and
// the keys are claimed once more.
func (m *Middleware) awaitOwnComplete(msg *message.Message, scope string, keys []string, c *stores.Claim, landings uint64) (*stores.Claim, error) {
	var deadline <-chan time.Time
	for tries := 0; c.Result == stores.InProgress; tries++ {
		landed := m.async.landing(scope, keys)
		if landed == nil {
			if tries > 0 || m.async.landings.Load() == landings {
				return c, nil
			}
			landed = closedChan
		}
		if deadline == nil {
			t := time.NewTimer(m.cfg.Tuning.CompleteTimeout)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-landed:
		case <-deadline:
			return c, nil
		case <-msg.Context().Done():
			return c, nil
		}
		again, err := m.calls.claim(msg.Context(), scope, keys, m.cfg.Lease)
		if err != nil {
			return nil, err
		}
		c = again
	}
	return c, nil
}

// closedChan is a channel that is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// waitInProgress re-claims every InProgressPoll until the keys are no
// longer in progress or InProgressWait has passed.
func (m *Middleware) waitInProgress(msg *message.Message, scope string, keys []string) (*stores.Claim, error) {
	deadline := time.NewTimer(m.cfg.InProgressWait)
	defer deadline.Stop()
	poll := time.NewTicker(m.cfg.Tuning.InProgressPoll)
	defer poll.Stop()
	for {
		select {
		case <-deadline.C:
			return &stores.Claim{Scope: scope, Keys: keys, Result: stores.InProgress}, nil
		case <-msg.Context().Done():
			return &stores.Claim{Scope: scope, Keys: keys, Result: stores.InProgress}, nil
		case <-poll.C:
			c, err := m.calls.claim(msg.Context(), scope, keys, m.cfg.Lease)
			if err != nil || c.Result != stores.InProgress {
				return c, err
			}
		}
	}
}

// runClaimed runs the handler under a heartbeat, then completes the
// claim, or releases it when the handler fails or panics. The heartbeat
// runs until Complete or Release is done, so a Complete retried through a
// store outage keeps its lease.
func (m *Middleware) runClaimed(h message.HandlerFunc, msg *message.Message, c *stores.Claim) (outputs []*message.Message, err error) {
	parent := msg.Context()
	// The beat is also the handler's context: one allocation carries the
	// claim (Value), the heartbeat state and, when first needed, the
	// cancellation.
	hb := &beat{c: c, parent: parent}
	msg.SetContext(hb)
	m.beats.add(hb)

	settled := false
	defer func() {
		if settled {
			return
		}
		// A handler error, or a panic going on up to the router's
		// Recoverer after the release.
		m.beats.remove(hb)
		hb.finish()
		msg.SetContext(parent)
		m.release(parent, c)
	}()
	outputs, err = h(msg)
	if err != nil {
		return nil, err
	}
	msg.SetContext(parent)
	// Encoded now, before outer middlewares (or the router) touch the
	// outputs, and before settled: a panicking Fingerprint releases the
	// claim like a panicking handler.
	data := m.encode(msg, outputs)
	settled = true
	hb.completing.Store(true)
	// A store that never blocks has no round trip to hide: complete inline.
	if f := m.startAsync(c); f != nil {
		go func() {
			defer m.async.done(f)
			m.completeAsync(parent, msg, c, data)
			m.beats.remove(hb)
			hb.finish()
		}()
		return outputs, nil
	}
	outputs, err = m.complete(msg, c, data, outputs)
	m.beats.remove(hb)
	hb.finish()
	return outputs, err
}

func (m *Middleware) release(parent context.Context, c *stores.Claim) {
	err := m.calls.release(parent, c)
	switch {
	case err == nil:
		m.cfg.Metrics.Observe(c.Scope, OutcomeReleased)
	case errors.Is(err, stores.ErrLostClaim):
		m.cfg.Metrics.Observe(c.Scope, OutcomeLostClaim)
	default:
		// The record stays processing until its lease runs out; then a
		// redelivery takes it over. Nothing is lost, only delayed.
		m.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
		m.cfg.Logger.Error("Dedup release failed: the message will be retried after the lease expires", err, watermill.LogFields{"scope": c.Scope, "keys": c.Keys})
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
func (m *Middleware) record(parent, wait context.Context, detach bool, c *stores.Claim, data []byte) error {
	var deadline time.Time // from the first failure: a clock read is not free
	backoff := 20 * time.Millisecond
	for {
		err := m.calls.complete(parent, detach, c, m.cfg.Retention, data)
		if err == nil || errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) {
			return err
		}
		if !isOutage(err) {
			// A refusal no retry changes (the data too large for the
			// store, say).
			return m.recordWithoutData(parent, detach, c, data, err)
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(m.cfg.Tuning.CompleteTimeout)
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
func (m *Middleware) recordWithoutData(parent context.Context, detach bool, c *stores.Claim, data []byte, refusal error) error {
	if len(data) == 0 {
		return refusal
	}
	if err := m.calls.complete(parent, detach, c, m.cfg.Retention, nil); err != nil {
		return refusal
	}
	m.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
	m.cfg.Logger.Error("Dedup store refused the record's data (the handler's outputs and fingerprint): the message is recorded done without them, so a redelivery after a failed publish of its outputs will not re-emit them", refusal, watermill.LogFields{"scope": c.Scope, "keys": c.Keys, "data_bytes": len(data)})
	return nil
}

// complete records the message done with its outputs, and returns what
// the middleware returns to the router.
func (m *Middleware) complete(msg *message.Message, c *stores.Claim, data []byte, outputs []*message.Message) ([]*message.Message, error) {
	// Retried for CompleteTimeout whatever becomes of the message's
	// context: its effect happened, and giving up early would leave the
	// record processing for a later duplicate to run again.
	err := m.record(msg.Context(), context.WithoutCancel(msg.Context()), true, c, data)
	if err == nil {
		return outputs, nil
	}
	if errors.Is(err, stores.ErrLostClaim) {
		return m.reconcile(msg.Context(), msg, c, data, outputs, err)
	}
	// The effect happened; nacking now would run it again once the lease
	// expires. Ack instead: the record stays processing until its lease
	// runs out, so only a further duplicate arriving after that runs again.
	m.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
	m.cfg.Logger.Error("Dedup Complete failed (for CompleteTimeout, or refused): acking anyway (the effect happened); a duplicate arriving after the lease expires would run again", err, m.fields(msg, c.Scope, c.Keys))
	return outputs, nil
}

// completeAsync is complete for a message already acked (AsyncComplete):
// the subscriber may have cancelled its context, so every call detaches
// from it, and a failure can only be reported.
//
// msgCtx is the message's context as the handler got it: the message
// itself belongs to the router again, which may set another.
func (m *Middleware) completeAsync(msgCtx context.Context, msg *message.Message, c *stores.Claim, data []byte) {
	// Detached from the message, whose subscriber may cancel it after the
	// ack, but stopped by a Close that gives up waiting.
	parent, cancel := context.WithCancel(context.WithoutCancel(msgCtx))
	defer cancel()
	defer context.AfterFunc(m.async.stop, cancel)()
	err := m.record(parent, parent, false, c, data)
	switch {
	case err == nil:
	case errors.Is(err, stores.ErrLostClaim):
		// The message is acked either way; reconcile records this run
		// when the record is gone and logs a takeover.
		_, _ = m.reconcile(parent, msg, c, data, nil, err)
	default:
		m.cfg.Metrics.Observe(c.Scope, OutcomeStoreError)
		m.cfg.Logger.Error("Dedup asynchronous Complete failed (the message was acked): its record stays processing until the lease expires, and a duplicate arriving after that would run again", err, m.fields(msg, c.Scope, c.Keys))
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
func (m *Middleware) reconcile(parent context.Context, msg *message.Message, c *stores.Claim, data []byte, outputs []*message.Message, lost error) ([]*message.Message, error) {
	again, err := m.calls.claim(parent, c.Scope, c.Keys, m.cfg.Lease)
	if err == nil {
		switch again.Result {
		case stores.Duplicate:
			if _, recorded, derr := decodeData(again.Data); derr == nil {
				return recorded, nil
			}
		case stores.Claimed:
			if err = m.calls.complete(parent, true, again, m.cfg.Retention, data); err == nil {
				return outputs, nil
			}
			m.release(parent, again)
		}
	}
	// Our lease expired and another consumer took the message over: its
	// run will complete (or release) the record. Nack, so the redelivery
	// finds its outcome — acking here could publish a second, different
	// set of outputs.
	m.cfg.Metrics.Observe(c.Scope, OutcomeLostClaim)
	m.cfg.Logger.Error("Dedup claim lost before Complete: the lease expired while the handler ran and another consumer took over (the effect may be doubled)", lost, m.fields(msg, c.Scope, c.Keys))
	return nil, fmt.Errorf("dedup: scope %q: message %s: %w", c.Scope, keyfuncs.Name(msg), lost)
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

// startAsync registers a background Complete of c, or returns nil when c
// completes before the ack: outside ModeAsyncComplete, on a store that
// never blocks, and after Close.
func (m *Middleware) startAsync(c *stores.Claim) *flight {
	if m.async == nil || m.calls.noTimeout {
		return nil
	}
	return m.async.start(c)
}
