package middleware

// The lease modes, ModeLease and ModeAsyncComplete: claim the keys under a
// lease, run the handler while the heartbeat extends it, then Complete the
// record (in the background under ModeAsyncComplete), or Release it when
// the handler fails.

import (
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/stores"
)

func (m *Middleware) handleLease(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	var landings uint64
	if m.async != nil {
		landings = m.async.landings.Load()
	}
	c, err := m.cyc.Claim(msg.Context(), scope, keys)
	if err == nil && c.Result == stores.InProgress && m.async != nil {
		c, err = m.awaitOwnComplete(msg, scope, keys, c, landings)
	}
	if err == nil && c.Result == stores.InProgress {
		var claimErr error
		werr := m.cyc.Await(msg, scope, keys, func() (bool, error) {
			again, err := m.cyc.Claim(msg.Context(), scope, keys)
			if err != nil {
				claimErr = err
				return false, err
			}
			c = again
			return c.Result == stores.InProgress, nil
		})
		if claimErr == nil && werr != nil {
			// Still in progress, or the message's context ended.
			return nil, werr
		}
		err = claimErr
	}
	if err != nil {
		bypass, err := m.cyc.ClaimFailed(msg, scope, keys, err)
		if bypass {
			return h(msg)
		}
		return nil, err
	}
	switch c.Result {
	case stores.Duplicate:
		return m.duplicate(msg, scope, keys, c.Data)
	case stores.Claimed:
	default:
		return nil, m.cyc.Unexpected(scope, c.Result)
	}

	m.cyc.Observe(scope, dedup.OutcomeClaimed)
	if c.Takeover {
		m.cyc.Takeover(msg, scope, keys)
	}
	m.checkTTL(msg, scope, keys)

	return m.runClaimed(h, msg, c)
}

// runClaimed runs the handler under a heartbeat, then completes the
// claim, or releases it when the handler fails or panics. The heartbeat
// runs until Complete or Release is done, so a Complete retried through a
// store failure keeps its lease.
func (m *Middleware) runClaimed(h message.HandlerFunc, msg *message.Message, c *stores.Claim) (outputs []*message.Message, err error) {
	parent := msg.Context()
	// The beat is also the handler's context: one allocation carries the
	// claim (Value), the heartbeat state and, when first needed, the
	// cancellation.
	hb := m.cyc.Hold(parent, c)
	msg.SetContext(hb)

	settled := false
	defer func() {
		if settled {
			return
		}
		// A handler error, or a panic going on up to the router's
		// Recoverer after the release.
		m.cyc.Drop(hb)
		msg.SetContext(parent)
		m.cyc.Release(parent, c, true)
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
	hb.Completing()
	// A store that never blocks has no round trip to hide: complete inline.
	if f := m.startAsync(c, msg, hb, data); f != nil {
		// Its context is the message's as the handler got it (hb's
		// parent), detached from its cancellation: the message itself
		// belongs to the router again, which may set another.
		m.async.run(f)
		return outputs, nil
	}
	// Retried for CompleteTimeout whatever becomes of the message's
	// context: its effect happened, and giving up early would leave the
	// record processing for a later duplicate to run again.
	rec, recorded := m.cyc.Complete(hb.Detached(), msg, hb, data)
	m.cyc.Drop(hb)
	switch rec {
	case cycle.DoneBefore:
		// Done by an earlier attempt whose reply was lost, or by a run
		// that took the message over: return the outputs recorded then.
		// A record done without outputs (this run's were dropped, as
		// too large to keep) returns this run's: outputs are published
		// at least once.
		if _, kept, err := record.Decode(recorded); err == nil && len(kept) > 0 {
			return kept, nil
		}
		return outputs, nil
	case cycle.TakenOver:
		// Our lease expired and another consumer took the message over:
		// its run will complete (or release) the record. Nack, so the
		// redelivery finds its outcome — acking here could publish a
		// second, different set of outputs.
		return nil, m.cyc.Errorf(msg, c.Scope, "%w", stores.ErrLostClaim)
	default:
		// Done; or not recorded, logged: the effect happened, and nacking
		// now would run it again once the lease expires. Ack instead: the
		// record stays processing until its lease runs out, so only a
		// further duplicate arriving after that runs again.
		return outputs, nil
	}
}
