package cycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// The error classes of the stores contract, read twice: before the
// effect, where only what is known to be an outage may be run through
// (FailOpen) and everything else stops the message; and after it, where
// everything not known to be permanent is retried.

// IsOutage reports a store error of the outage class: the backend is
// unreachable (stores.ErrUnavailable), or a store call outlived
// StoreTimeout while the message's context was still alive.
func IsOutage(err error) bool {
	return errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// refused reports a store error no retry of the same call changes: the
// claim is not the owner any more, the store is closed, or it refused an
// argument (a retention past its bound, data too large) or a key.
func refused(err error) bool {
	return errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) ||
		errors.Is(err, stores.ErrInvalidArgument) || errors.Is(err, stores.ErrInvalidKey)
}

// ClaimFailed decides what becomes of a message whose Claim (or Begin)
// failed with err, by the class of err: a key the store refuses is bad
// input (permanent); a message whose context ended fails with it
// (cancelled); an outage is run through under FailOpen (bypass is true,
// and the effect runs unprotected); everything else — a closed store, a
// refused argument, an error the store does not classify, a dead outer
// transaction — fails the message under either policy, since the store
// is not known to be unreachable and running the effect unprotected
// could repeat one it has recorded.
func (c *Cycle) ClaimFailed(msg *message.Message, scope string, keys []string, err error) (bypass bool, _ error) {
	o, bypass := c.failure(msg.Context(), err)
	switch o {
	case dedup.OutcomeNoKey:
		// A key function returned something the store rejects: bad input,
		// not an outage.
		return false, c.Permanent(msg, scope, keys, o, fmt.Errorf("%sscope %q: %w: message %s: %w", c.side.Prefix, scope, keyfuncs.ErrNoKey, keyfuncs.Name(msg), err))
	case dedup.OutcomeCancelled:
		c.Observe(scope, o)
		return false, c.Errorf(msg, scope, "its context ended before the store answered: %w", errors.Join(msg.Context().Err(), err))
	}
	c.Observe(scope, dedup.OutcomeStoreError)
	if bypass {
		c.Observe(scope, dedup.OutcomeBypassed)
		f := c.Fields(msg, scope, keys)
		f["error"] = err.Error()
		c.p.Logger.Error("Dedup store unavailable: running "+c.side.Effect+" UNPROTECTED (fail-open); reconcile these keys", err, f)
		return true, nil
	}
	return false, fmt.Errorf("%w: %smessage %s, scope %q: %w", dedup.ErrStore, publishPrefix(c.side), keyfuncs.Name(msg), scope, err)
}

// failure is what a Claim (or Begin) that failed with err means for a
// message whose context is msgCtx: the outcome it is counted as
// (OutcomeNoKey, OutcomeCancelled, OutcomeBypassed or OutcomeStoreError),
// and whether its effect runs unprotected.
func (c *Cycle) failure(msgCtx context.Context, err error) (dedup.Outcome, bool) {
	switch {
	case errors.Is(err, stores.ErrInvalidKey):
		return dedup.OutcomeNoKey, false
	case msgCtx.Err() != nil:
		return dedup.OutcomeCancelled, false
	case c.p.OnStoreError == dedup.FailOpen && IsOutage(err):
		return dedup.OutcomeBypassed, true
	}
	return dedup.OutcomeStoreError, false
}

// publishPrefix keeps "publish: " after ErrStore's own "dedup: ".
func publishPrefix(s Side) string {
	if s == Producer {
		return "publish: "
	}
	return ""
}
