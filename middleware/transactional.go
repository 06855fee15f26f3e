package middleware

// ModeTransactional, the transactional inbox: the record is written in the
// database transaction the handler writes its effects in.

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

// handleTx is the transactional inbox flow: the record is inserted in a
// database transaction that the handler writes its effects in, and
// commits with them.
func (m *Middleware) handleTx(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error) {
	tx, err := m.cyc.Begin(msg.Context(), scope, keys)
	var r stores.Result
	if err == nil {
		r = tx.Result()
	}
	// FailOpen is refused with ModeTransactional: never a Bypass.
	switch v, err := m.cyc.Decide(msg, scope, keys, r, false, err); v {
	case cycle.Run:
		m.cyc.Claimed(msg, scope, keys)
		return m.cyc.RunInTx(msg, scope, keys, tx, h)
	case cycle.Skip:
		return m.cyc.Duplicate(msg, scope, keys, tx.Data())
	case cycle.Busy:
		return nil, m.cyc.InProgress(msg, scope, keys)
	default:
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(msg.Context()))
		}
		return nil, err
	}
}
