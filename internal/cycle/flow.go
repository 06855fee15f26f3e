package cycle

// The claim cycle as the adapters run it, in three steps:
//
//	claim and decide   Decide (after Claim or Begin), or ClaimAndDecide,
//	                   which also waits while another run holds a key
//	run                Run: the effect under a heartbeat that holds the
//	                   claim; a failed or panicking effect releases it
//	finish             Finish: the record done, retried, and what the
//	                   message's delivery returns
//
// The transactional inbox has no heartbeat: its run is the transaction,
// and Commit or Rollback finishes it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Verdict is what a claim decided for a message's effect.
type Verdict uint8

const (
	// Run: the keys are claimed; run the effect.
	Run Verdict = iota
	// Skip: the message was done within the window: a duplicate, whose
	// record's data the adapter reads (Duplicate).
	Skip
	// Busy: another run holds a key: wait (Await) or fail (InProgress).
	Busy
	// Bypass: the store is down and the policy is FailOpen: run the
	// effect unprotected (counted and logged).
	Bypass
	// Fail: the message fails with the error Decide returns (counted and
	// logged where it needs to be).
	Fail
)

// Decide is the step after every Claim and every inbox Begin: it
// classifies what the call returned — its result r (and whether the claim
// took over an expired lease) or its error err — counts and logs what
// needs it, and returns what becomes of the message's effect. An error
// is classified by ClaimFailed; a takeover is counted and logged; a
// result outside the contract fails the message.
func (c *Cycle) Decide(msg *message.Message, scope string, keys []string, r stores.Result, takeover bool, err error) (Verdict, error) {
	if err != nil {
		bypass, err := c.ClaimFailed(msg, scope, keys, err)
		if bypass {
			return Bypass, nil
		}
		return Fail, err
	}
	switch r {
	case stores.Claimed:
		if takeover {
			c.Takeover(msg, scope, keys)
		}
		return Run, nil
	case stores.Duplicate:
		return Skip, nil
	case stores.InProgress:
		return Busy, nil
	}
	return Fail, c.Unexpected(scope, r)
}

// ClaimAndDecide claims msg's keys and decides. While another run holds
// a key it first calls own, when set (a mode's wait for a Complete of its
// own still on its way), then waits up to InProgressWait, claiming again
// every InProgressPoll (Await). The claim is returned for Run; Busy is
// never returned: a wait that ends with a key still held fails the
// message with dedup.ErrInProgress.
func (c *Cycle) ClaimAndDecide(msg *message.Message, scope string, keys []string, own func(*stores.Claim) (*stores.Claim, error)) (*stores.Claim, Verdict, error) {
	cl, err := c.Claim(msg.Context(), scope, keys)
	if err == nil && cl.Result == stores.InProgress && own != nil {
		cl, err = own(cl)
	}
	if err == nil && cl.Result == stores.InProgress {
		var claimErr error
		werr := c.Await(msg, scope, keys, func() (bool, error) {
			again, err := c.Claim(msg.Context(), scope, keys)
			if err != nil {
				claimErr = err
				return false, err
			}
			cl = again
			return cl.Result == stores.InProgress, nil
		})
		if claimErr == nil && werr != nil {
			// Still in progress, or the message's context ended.
			return nil, Fail, werr
		}
		err = claimErr
	}
	if err != nil {
		v, err := c.Decide(msg, scope, keys, 0, false, err)
		return nil, v, err
	}
	v, err := c.Decide(msg, scope, keys, cl.Result, cl.Takeover, nil)
	return cl, v, err
}

// Claimed counts a message whose keys are claimed and whose effect runs
// now, and checks its age against Retention (Needs.PublishedAt): a
// message older than that was possibly handled before, and its record
// expired (counted as dedup.OutcomeTTLMiss and logged).
func (c *Cycle) Claimed(msg *message.Message, scope string, keys []string) {
	c.Observe(scope, dedup.OutcomeClaimed)
	if c.publishedAt == nil {
		return
	}
	at, ok := c.publishedAt(msg)
	if !ok {
		return
	}
	if age := time.Since(at); age > c.p.Retention {
		c.Observe(scope, dedup.OutcomeTTLMiss)
		f := c.Fields(msg, scope, keys)
		f["age"] = age.String()
		f["retention"] = c.p.Retention.String()
		err := fmt.Errorf("%w: published %s ago, retention %s", errTTLMiss, age, c.p.Retention)
		c.p.Logger.Error("Message older than the dedup retention window runs again if it was handled before (ttl_miss)", err, f)
	}
}

// errTTLMiss is the error logged with a message older than Retention.
var errTTLMiss = errors.New("dedup: message older than the retention window")

// Run runs effect for msg under a heartbeat that holds cl: msg's context
// is the Beat while it runs (it carries the claim, ClaimFromContext, and
// is cancelled with stores.ErrLostClaim when the lease is found lost).
// When effect fails, or panics, the claim is released (counted as
// dedup.OutcomeReleased) and the error returned, or the panic goes on up.
// When it succeeds, Run encodes the record's data (Encode, before anyone
// else touches the outputs; a panicking Needs.Fingerprint releases the
// claim like a panicking effect) and returns the Beat, still holding the
// claim, for Finish.
func (c *Cycle) Run(msg *message.Message, cl *stores.Claim, effect func(*message.Message) ([]*message.Message, error)) (outputs []*message.Message, data []byte, hb *Beat, err error) {
	parent := msg.Context()
	// The beat is also the effect's context: one allocation carries the
	// claim (Value), the heartbeat state and, when first needed, the
	// cancellation.
	beat := c.Hold(parent, cl)
	msg.SetContext(beat)
	settled := false
	defer func() {
		if settled {
			return
		}
		c.Drop(beat)
		msg.SetContext(parent)
		c.Release(parent, cl, true)
	}()
	outputs, err = effect(msg)
	if err != nil {
		return nil, nil, nil, err
	}
	msg.SetContext(parent)
	data = c.EncodeFor(msg, outputs)
	settled = true
	beat.Completing()
	return outputs, data, beat, nil
}

// Finish records the message done after its effect ran under hb (see
// Complete: every failure not known to be permanent is retried for
// CompleteTimeout; ctx must be detached from the message's cancellation),
// stops the heartbeat, and returns what the message's delivery returns:
//   - done: outputs, this run's;
//   - found done before (an earlier attempt whose reply was lost, or a run
//     that took the message over): the outputs that record keeps, or
//     this run's when it keeps none (outputs go out at least once);
//   - taken over by another run after this claim's lease ran out: an
//     error wrapping stores.ErrLostClaim, so the delivery is nacked and
//     its redelivery finds the other run's outcome (an ack could publish
//     a second, different set of outputs);
//   - not recorded (logged and counted): outputs. The effect happened, and
//     a nack would run it again once the lease expires; acked, only a
//     later duplicate arriving after the lease runs again.
func (c *Cycle) Finish(ctx context.Context, msg *message.Message, hb *Beat, data []byte, outputs []*message.Message) ([]*message.Message, error) {
	rec, recorded := c.Complete(ctx, msg, hb, data)
	c.Drop(hb)
	switch rec {
	case DoneBefore:
		if _, kept, err := record.Decode(recorded); err == nil && len(kept) > 0 {
			return kept, nil
		}
	case TakenOver:
		return nil, c.Errorf(msg, hb.c.Scope, "%w", stores.ErrLostClaim)
	}
	return outputs, nil
}

// RunInTx runs effect for msg in the inbox transaction tx (the
// transactional inbox's run and finish): msg's context carries tx while
// it runs (tx.Context). When effect succeeds, tx commits with the
// record's data (EncodeFor); a failed commit leaves neither effect nor
// record and fails the message with an error wrapping dedup.ErrStore.
// When effect fails or panics, tx is rolled back (counted as
// dedup.OutcomeReleased; a failed rollback is logged) and the error
// returned, or the panic goes on up.
func (c *Cycle) RunInTx(msg *message.Message, scope string, keys []string, tx stores.InboxTx, effect func(*message.Message) ([]*message.Message, error)) (outputs []*message.Message, err error) {
	parent := msg.Context()
	msg.SetContext(tx.Context(parent))
	committed := false
	defer func() {
		msg.SetContext(parent)
		if committed {
			return
		}
		rerr := c.Rollback(parent, scope, tx)
		c.Observe(scope, dedup.OutcomeReleased)
		if rerr != nil {
			c.p.Logger.Error("Dedup inbox rollback failed", rerr, c.Fields(msg, scope, keys))
		}
	}()
	outputs, err = effect(msg)
	if err != nil {
		return nil, err
	}
	if err = c.Commit(parent, scope, tx, c.EncodeFor(msg, outputs)); err != nil {
		// Not committed: neither the effect nor the record exists. Nack.
		c.Observe(scope, dedup.OutcomeStoreError)
		return nil, fmt.Errorf("%w: commit of message %s, scope %q: %w", dedup.ErrStore, keyfuncs.Name(msg), scope, err)
	}
	committed = true
	return outputs, nil
}

// EncodeFor is the data a done record keeps for msg and the outputs of its
// effect: msg's fingerprint (Needs.Fingerprint) and the outputs, and when
// runs are linked the span context of msg's span.
func (c *Cycle) EncodeFor(msg *message.Message, outputs []*message.Message) []byte {
	var fp []byte
	if c.fingerprint != nil {
		fp = c.fingerprint(msg)
	}
	return c.encode(fp, outputs, trace.SpanContextFromContext(msg.Context()))
}
