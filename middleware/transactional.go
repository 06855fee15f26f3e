package middleware

// ModeTransactional, the transactional inbox: the record is written in the
// database transaction the handler writes its effects in.

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// handleTx is the transactional inbox flow: the record is inserted in a
// database transaction that the handler writes its effects in.
func (m *Middleware) handleTx(h message.HandlerFunc, msg *message.Message, scope string, keys []string) (outputs []*message.Message, err error) {
	parent := msg.Context()
	tx, err := m.cyc.Begin(parent, scope, keys)
	var r stores.Result
	if err == nil {
		r = tx.Result()
	}
	// FailOpen is refused with ModeTransactional: never a Bypass.
	switch v, err := m.cyc.Decide(msg, scope, keys, r, false, err); v {
	case cycle.Skip:
		return m.cyc.Duplicate(msg, scope, keys, tx.Data())
	case cycle.Busy:
		return nil, m.cyc.InProgress(msg, scope, keys)
	case cycle.Run:
	default:
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(parent))
		}
		return nil, err
	}
	m.cyc.Claimed(msg, scope, keys)

	msg.SetContext(tx.Context(parent))
	committed := false
	defer func() {
		msg.SetContext(parent)
		if committed {
			return
		}
		rerr := m.cyc.Rollback(parent, scope, tx)
		m.cyc.Observe(scope, dedup.OutcomeReleased)
		if rerr != nil {
			m.cyc.Logger().Error("Dedup inbox rollback failed", rerr, m.cyc.Fields(msg, scope, keys))
		}
	}()
	outputs, err = h(msg)
	if err != nil {
		return nil, err
	}
	if err = m.cyc.Commit(parent, scope, tx, m.cyc.EncodeFor(msg, outputs)); err != nil {
		// Not committed: neither the effect nor the record exists. Nack.
		m.cyc.Observe(scope, dedup.OutcomeStoreError)
		return nil, fmt.Errorf("%w: commit of message %s, scope %q: %w", dedup.ErrStore, keyfuncs.Name(msg), scope, err)
	}
	committed = true
	return outputs, nil
}
