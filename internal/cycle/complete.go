package cycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Recorded is what became of a message's record after its effect.
type Recorded uint8

const (
	// Done: the record is done, with this run's data (or without it,
	// logged, when the store would not keep it).
	Done Recorded = iota + 1
	// DoneBefore: the record was found done already — by an earlier
	// attempt of this Complete whose reply was lost, or by a run that
	// took the message over; Complete returns that record's data.
	DoneBefore
	// TakenOver: another run holds the keys now (this claim's lease ran
	// out and it took the message over): its run will complete or
	// release the record. Counted and logged.
	TakenOver
	// NotRecorded: Complete failed for CompleteTimeout, or was refused
	// for good (a closed store). The record stays processing until its
	// lease runs out, after which a duplicate runs the effect again.
	// Counted and logged.
	NotRecorded
)

// Complete records the claim b holds done with data after its effect.
// Every failure that is not known to be permanent — an outage, a server
// failing over, an error the store does not classify — is retried with a
// doubling backoff for CompleteTimeout from the first failure, while the
// heartbeat keeps the lease (the caller drops b after Complete): a store
// failure shorter than that loses nothing and doubles nothing. No Extend
// of the claim is in flight during an attempt: a store whose fenced calls
// compare and swap could fail one of the two. Retries stop early only
// when ctx is done; ctx must therefore not be the message's context but
// one detached from its cancellation (whatever becomes of the message,
// the effect happened), cancelled only when the caller gives up for good
// (Close). Data the store does not keep (larger than its MaxData, or
// refused), or that kept the record from being written until
// CompleteTimeout, is dropped and the record completed without it,
// loudly.
//
// A refusal with stores.ErrLostClaim is reconciled by claiming the keys
// again (see Recorded). It returns the outcome and, for DoneBefore, the
// data of the record found done. A record that lost its data or was not
// written is counted once as dedup.OutcomeStoreError (failures that a
// retry overcame are not: every failed call is in the store latency
// metric), a lost claim as dedup.OutcomeLostClaim.
func (c *Cycle) Complete(ctx context.Context, msg *message.Message, b *Beat, data []byte) (Recorded, []byte) {
	r := &recording{c: c, ctx: ctx, msg: msg, b: b}
	defer func() {
		r.lost.end()
	}()
	if err := c.caps.CheckData(data); err != nil {
		data = r.drop(data, err)
	}
	got, recorded := r.complete(data)
	if r.failed {
		c.Observe(b.c.Scope, dedup.OutcomeStoreError)
	}
	return got, recorded
}

// recording is one Complete's way to its record: its retries share one
// deadline, CompleteTimeout from the first failure.
type recording struct {
	c        *Cycle
	ctx      context.Context
	msg      *message.Message
	b        *Beat
	deadline time.Time
	failed   bool // the record lost its data or was not written (counted once)
	// lost is the span of the Complete refused as a lost claim, when
	// runs are linked: reconcile links it to the run that took over.
	lost keptSpan
}

func (r *recording) complete(data []byte) (Recorded, []byte) {
	err := r.record(r.b, data)
	switch {
	case err == nil:
		return Done, nil
	case errors.Is(err, stores.ErrLostClaim):
		return r.reconcile(data, err)
	default:
		return r.notRecorded(r.b.c, "Dedup could not record the message done after "+r.c.side.Effect+" ran: its record stays processing until the lease runs out", err)
	}
}

// notRecorded logs and counts a message whose record was not written
// (retried for Tuning.CompleteTimeout, or refused for good): a duplicate
// arriving after the lease runs out runs its effect again.
func (r *recording) notRecorded(cl *stores.Claim, msg string, err error) (Recorded, []byte) {
	r.failed = true
	f := r.c.Fields(r.msg, cl.Scope, cl.Keys)
	f["consequence"] = "a duplicate arriving after the lease runs out runs the effect again"
	r.c.p.Logger.Error(msg, err, f)
	return NotRecorded, nil
}

// record completes b's claim with data until it succeeds, is refused for
// good, or CompleteTimeout has passed; data the store refused, or that
// was still not written at the deadline, is dropped and the record
// completed once more (retried until the same deadline) without it.
func (r *recording) record(b *Beat, data []byte) error {
	for {
		err := r.retrying(func() error {
			return b.serially(func() error { return r.c.complete(r.ctx, b.c, data, &r.lost) })
		})
		if err == nil || errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) || len(data) == 0 || r.ctx.Err() != nil {
			return err
		}
		// The store may have refused the data (outputs too large to
		// keep, in a way it does not classify): a record done without
		// them is better than one left processing.
		data = r.drop(data, err)
	}
}

// retrying calls call until it succeeds, fails for good (refused), ctx is
// done, or the deadline — CompleteTimeout after the first failure of the
// Complete — has passed; the last attempt is at the deadline. It returns
// call's last error.
func (r *recording) retrying(call func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := call()
		if err == nil || refused(err) || r.ctx.Err() != nil {
			return err
		}
		now := time.Now()
		if r.deadline.IsZero() {
			r.deadline = now.Add(r.c.p.Tuning.CompleteTimeout)
		}
		if left := r.deadline.Sub(now); left <= 0 || !sleepCtx(r.ctx, min(backoff, left)) {
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// drop reports data the store will not keep with the record, and returns
// nil: the record is completed without it. The price is loud: a
// redelivery after a failed publish of the handler's outputs acks
// without re-emitting them.
func (r *recording) drop(data []byte, refusal error) []byte {
	r.failed = true
	r.c.dropped(r.b.c.Scope, r.b.c.Keys, data, refusal)
	return nil
}

// dropped logs data completed without: err is the store's refusal of it,
// or (not a refusal) the error of the last attempt at CompleteTimeout.
func (c *Cycle) dropped(scope string, keys []string, data []byte, err error) {
	what, consequence := "outputs", "a redelivery after a failed publish of the outputs will not re-emit them"
	if info, ierr := record.Inspect(data); ierr == nil && info.Outputs == 0 {
		// Only the fingerprint: there are no outputs to re-emit.
		what, consequence = "payload fingerprint", "a later message with these keys and another payload is not refused as a mismatch"
	}
	f := watermill.LogFields{"scope": scope, "keys": keys, "data_bytes": len(data), "consequence": consequence}
	if !refused(err) {
		c.p.Logger.Error("Dedup could not record the message's "+what+" within Tuning.CompleteTimeout: completing without them", err, f)
		return
	}
	if what == "outputs" {
		what = "outputs and fingerprint"
	}
	c.p.Logger.Error("Dedup store will not keep the record's "+what+": completing without them", err, f)
}

// reconcile decides what a Complete refused with ErrLostClaim means by
// claiming the keys again (retried like the Complete, until the same
// deadline). The refusal has four causes, told apart by the claim:
//   - Duplicate: the record is done — by an earlier attempt of this
//     Complete whose reply was lost, or by a run that took the message
//     over (DoneBefore, with its data).
//   - Claimed: the record is gone (the store lost it): record this run
//     under the new claim.
//   - InProgress, and the claim still extends: the record is still ours
//     (a store that failed the Complete beside the claim's own call):
//     record again.
//   - InProgress otherwise: another run took the message over and is
//     running it (TakenOver).
//
// When the keys cannot be claimed again, or the new claim cannot be
// completed, the message is NotRecorded: its effect happened, and
// claiming it lost could run it again.
func (r *recording) reconcile(data []byte, lost error) (Recorded, []byte) {
	c, cl := r.c, r.b.c
	var again *stores.Claim
	err := r.retrying(func() error {
		var err error
		again, err = c.Claim(r.ctx, cl.Scope, cl.Keys)
		return err
	})
	if err != nil {
		// The record may be done, gone or another run's.
		return r.notRecorded(cl, "Dedup Complete was refused as a lost claim, and claiming the keys again failed", errors.Join(lost, err))
	}
	switch again.Result {
	case stores.Duplicate:
		linkTaker(r.lost.span, again, trace.SpanContextFromContext(r.msg.Context()))
		return DoneBefore, again.Data
	case stores.Claimed:
		// Not held: the new claim is completed at once.
		if err := r.record(&Beat{c: again, parent: r.ctx}, data); err != nil {
			return r.notRecorded(again, "Dedup record vanished before Complete, and recording it again failed: it stays processing until the lease runs out", err)
		}
		return Done, nil
	case stores.InProgress:
		if r.b.serially(func() error { return c.extend(r.ctx, cl) }) == nil {
			if err := r.record(r.b, data); err == nil {
				return Done, nil
			}
		}
	}
	linkTaker(r.lost.span, again, trace.SpanContextFromContext(r.msg.Context()))
	c.Observe(cl.Scope, dedup.OutcomeLostClaim)
	c.p.Logger.Error("Dedup claim lost before Complete: the lease expired while "+c.side.Effect+" ran and another run took the message over (the effect may be doubled)", lost, c.Fields(r.msg, cl.Scope, cl.Keys))
	return TakenOver, nil
}

// Release deletes cl's records so that a retry can claim them; counted
// as released when count is set (the effect failed). A failed Release
// is logged: the record stays processing until its lease runs out, then
// a retry takes it over; nothing is lost, only delayed. It returns the
// store's error.
func (c *Cycle) Release(ctx context.Context, cl *stores.Claim, count bool) error {
	err := c.release(ctx, cl)
	switch {
	case err == nil:
		if count {
			c.Observe(cl.Scope, dedup.OutcomeReleased)
		}
	case errors.Is(err, stores.ErrLostClaim):
		c.Observe(cl.Scope, dedup.OutcomeLostClaim)
	default:
		c.Observe(cl.Scope, dedup.OutcomeStoreError)
		c.p.Logger.Error("Dedup release failed: the message can be retried once the lease expires", err, watermill.LogFields{"scope": cl.Scope, "keys": cl.Keys})
	}
	return err
}

// Commit commits a message's inbox transaction with data, or without
// it (logged) when the store would not keep it. It does not retry: a
// failed Commit leaves neither effect nor record, and the message must
// run again.
func (c *Cycle) Commit(parent context.Context, scope string, tx stores.InboxTx, data []byte) error {
	refusal := c.caps.CheckData(data)
	err := refusal
	if refusal == nil {
		err = c.commit(parent, scope, tx, data)
	}
	if errors.Is(err, stores.ErrTooLarge) {
		// Refused before anything was sent: the transaction is open.
		c.Observe(scope, dedup.OutcomeStoreError)
		c.dropped(scope, nil, data, err)
		err = c.commit(parent, scope, tx, nil)
	}
	return err
}

// Duplicate decodes the data of a message found done, checks the
// fingerprint the record keeps against msg's (Needs.Fingerprint, when
// both are there), and returns the outputs the record keeps. A record it
// cannot decode or whose fingerprint differs fails the message for good.
func (c *Cycle) Duplicate(msg *message.Message, scope string, keys []string, data []byte) ([]*message.Message, error) {
	stored, outputs, err := record.Decode(data)
	if err != nil {
		return nil, c.Permanent(msg, scope, keys, dedup.OutcomeCorruptRecord, c.Errorf(msg, scope, "%w", err))
	}
	if c.fingerprint != nil && len(stored) > 0 && string(c.fingerprint(msg)) != string(stored) {
		return nil, c.Permanent(msg, scope, keys, dedup.OutcomeFingerprintMismatch, fmt.Errorf("%w: message %s, scope %q, keys %q", dedup.ErrFingerprintMismatch, keyfuncs.Name(msg), scope, keys))
	}
	c.Observe(scope, dedup.OutcomeDuplicate)
	return outputs, nil
}
