package middleware

// ModeLease: claim the keys under a lease, run the handler while the
// heartbeat extends it, then record the message done before the ack, or
// release the claim when the handler fails.

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

func (m *Middleware) handleLease(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	c, out, err, done := m.claim(h, msg, scope, keys, nil)
	if done {
		return out, err
	}
	outputs, data, hb, err := m.cyc.Run(msg, c, h)
	if err != nil {
		return nil, err
	}
	// Retried for CompleteTimeout whatever becomes of the message's
	// context: its effect happened, and giving up early would leave the
	// record processing for a later duplicate to run again.
	return m.cyc.Finish(hb.Detached(), msg, hb, data, outputs)
}

// claim is the lease modes' first step: it claims msg's keys (own, when
// set, waits for a Complete of this middleware's own still on its way)
// and returns the claim to run under; or, with done set, what the
// message's delivery returns: a duplicate's recorded outputs, the
// handler's own run unprotected (FailOpen), or the error.
func (m *Middleware) claim(h message.HandlerFunc, msg *message.Message, scope string, keys []string, own func(*stores.Claim) (*stores.Claim, error)) (c *stores.Claim, outputs []*message.Message, err error, done bool) {
	c, v, err := m.cyc.ClaimAndDecide(msg, scope, keys, own)
	switch v {
	case cycle.Run:
		m.cyc.Claimed(msg, scope, keys)
		return c, nil, nil, false
	case cycle.Skip:
		outputs, err = m.cyc.Duplicate(msg, scope, keys, c.Data)
	case cycle.Bypass:
		outputs, err = h(msg)
	}
	return nil, outputs, err, true
}
