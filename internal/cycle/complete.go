package cycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
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

// Complete records cl done with data after its effect. Every failure that
// is not known to be permanent — an outage, a server failing over, an
// error the store does not classify — is retried with a doubling backoff
// for CompleteTimeout from the first failure, while the heartbeat (the
// caller keeps cl held) keeps the lease: a store failure shorter than
// that loses nothing and doubles nothing. Retries stop early only when
// ctx is done; ctx must therefore not be the message's context but one
// detached from its cancellation (whatever becomes of the message, the
// effect happened), cancelled only when the caller gives up for good
// (Close). Data the store does not keep (larger than its MaxData, or
// refused) is dropped and the record completed without it, loudly.
//
// A refusal with stores.ErrLostClaim is reconciled by claiming the keys
// again (see Recorded). It returns the outcome and, for DoneBefore, the
// data of the record found done.
func (c *Cycle) Complete(ctx context.Context, msg *message.Message, cl *stores.Claim, data []byte) (Recorded, []byte) {
	if err := c.caps.CheckData(data); err != nil {
		data = c.dropData(cl, data, err)
	}
	err := c.record(ctx, cl, data)
	switch {
	case err == nil:
		return Done, nil
	case errors.Is(err, stores.ErrLostClaim):
		return c.reconcile(ctx, msg, cl, data, err)
	default:
		c.Observe(cl.Scope, dedup.OutcomeStoreError)
		c.p.Logger.Error("Dedup could not record the message done after "+c.side.Effect+" ran (retried for Tuning.CompleteTimeout, or refused for good): its record stays processing until the lease runs out, and a duplicate arriving after that runs it again", err, c.Fields(msg, cl.Scope, cl.Keys))
		return NotRecorded, nil
	}
}

// record runs Complete until it succeeds, is refused for good, or
// CompleteTimeout has passed since its first failure (then, when the
// record carries data, once more without it).
func (c *Cycle) record(ctx context.Context, cl *stores.Claim, data []byte) error {
	var deadline time.Time // from the first failure: a clock read is not free
	backoff := 20 * time.Millisecond
	for {
		err := c.complete(ctx, cl, data)
		if err == nil || errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) {
			return err
		}
		if refused(err) {
			if len(data) == 0 {
				return err
			}
			// The store may have refused the data (outputs too large
			// to keep): a record done without them is better than one
			// left processing.
			data = c.dropData(cl, data, err)
			continue
		}
		if ctx.Err() != nil {
			return err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(c.p.Tuning.CompleteTimeout)
		}
		// The last retry is at the deadline, not a backoff before it.
		if left := deadline.Sub(now); left <= 0 || !sleepCtx(ctx, min(backoff, left)) {
			if len(data) == 0 || ctx.Err() != nil {
				return err
			}
			// A last attempt without the data, in case the store
			// refused it in a way it does not classify (a column too
			// small, a server's size limit): a record done without its
			// outputs is better than one left processing.
			data = c.dropData(cl, data, err)
			continue
		}
		backoff = min(2*backoff, time.Second)
	}
}

// dropData reports data the store will not keep with cl's record, and
// returns nil: the record is completed without it. The price is loud: a
// redelivery after a failed publish of the handler's outputs acks
// without re-emitting them.
func (c *Cycle) dropData(cl *stores.Claim, data []byte, refusal error) []byte {
	c.Observe(cl.Scope, dedup.OutcomeStoreError)
	f := watermill.LogFields{"scope": cl.Scope, "keys": cl.Keys, "data_bytes": len(data)}
	c.p.Logger.Error("Dedup store will not keep the record's data (the handler's outputs and fingerprint): completing the record without them, so a redelivery after a failed publish of its outputs will not re-emit them", refusal, f)
	return nil
}

// reconcile decides what a Complete refused with ErrLostClaim means by
// claiming the keys again. The refusal has three causes, told apart by
// the claim:
//   - Duplicate: the record is done — by an earlier attempt of this
//     Complete whose reply was lost, or by a run that took the message
//     over (DoneBefore, with its data).
//   - Claimed: the record is gone (the store lost it): record this run.
//   - InProgress: another run took the message over and is running it
//     (TakenOver).
func (c *Cycle) reconcile(ctx context.Context, msg *message.Message, cl *stores.Claim, data []byte, lost error) (Recorded, []byte) {
	again, err := c.Claim(ctx, cl.Scope, cl.Keys)
	if err == nil {
		switch again.Result {
		case stores.Duplicate:
			return DoneBefore, again.Data
		case stores.Claimed:
			if err = c.complete(ctx, again, data); err == nil {
				return Done, nil
			}
			c.Release(ctx, again, false)
		}
	}
	c.Observe(cl.Scope, dedup.OutcomeLostClaim)
	c.p.Logger.Error("Dedup claim lost before Complete: the lease expired while "+c.side.Effect+" ran and another run took the message over (the effect may be doubled)", lost, c.Fields(msg, cl.Scope, cl.Keys))
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
	if err := c.caps.CheckData(data); err != nil {
		data = c.dropData(&stores.Claim{Scope: scope}, data, err)
	}
	err := c.commit(parent, scope, tx, data)
	if errors.Is(err, stores.ErrTooLarge) {
		// Refused before anything was sent: the transaction is open.
		err = c.commit(parent, scope, tx, c.dropData(&stores.Claim{Scope: scope}, data, err))
	}
	return err
}

// Duplicate decodes the data of a message found done, checks the
// fingerprint the record keeps against fingerprint(msg) (when both are
// there), and returns the outputs the record keeps. A record it cannot
// decode or whose fingerprint differs fails the message for good.
func (c *Cycle) Duplicate(msg *message.Message, scope string, keys []string, data []byte, fingerprint func(*message.Message) []byte) ([]*message.Message, error) {
	stored, outputs, err := DecodeData(data)
	if err != nil {
		return nil, c.Permanent(msg, scope, keys, dedup.OutcomeCorruptRecord, c.Errorf(msg, scope, "%w", err))
	}
	if fingerprint != nil && len(stored) > 0 && string(fingerprint(msg)) != string(stored) {
		return nil, c.Permanent(msg, scope, keys, dedup.OutcomeFingerprintMismatch, fmt.Errorf("%w: message %s, scope %q, keys %q", dedup.ErrFingerprintMismatch, keyfuncs.Name(msg), scope, keys))
	}
	c.Observe(scope, dedup.OutcomeDuplicate)
	return outputs, nil
}
