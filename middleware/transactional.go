package middleware

// ModeTransactional, the transactional inbox: the record is written in the
// database transaction the handler writes its effects in.

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// handleTx is the transactional inbox flow: the record is inserted in a
// database transaction that the handler writes its effects in.
func (m *Middleware) handleTx(h message.HandlerFunc, msg *message.Message, scope string, keys []string) (outputs []*message.Message, err error) {
	parent := msg.Context()
	start := m.calls.now()
	// StoreTimeout bounds Begin, including a wait for a concurrent
	// transaction holding the same key: that duplicate is then nacked,
	// and finds the other run's outcome when it is redelivered.
	bctx, cancel := m.calls.ctx(parent, false)
	tx, err := m.inbox.Begin(bctx, scope, keys, m.cfg.Retention)
	cancel()
	m.calls.observe(scope, OpBegin, start, err)
	if err != nil {
		return m.storeFailed(h, msg, scope, keys, err)
	}
	switch tx.Result() {
	case stores.Duplicate:
		return m.duplicate(msg, scope, keys, tx.Data())
	case stores.InProgress:
		return nil, m.inProgress(msg, scope, keys)
	case stores.Claimed:
	default:
		_ = tx.Rollback(context.WithoutCancel(parent))
		return nil, fmt.Errorf("dedup: scope %q: inbox %T returned result %s", scope, m.inbox, tx.Result())
	}
	m.cfg.Metrics.Observe(scope, OutcomeClaimed)
	m.checkTTL(msg, scope, keys)

	msg.SetContext(tx.Context(parent))
	committed := false
	defer func() {
		msg.SetContext(parent)
		if committed {
			return
		}
		ctx, cancel := m.calls.ctx(parent, true)
		defer cancel()
		start := m.calls.now()
		rerr := tx.Rollback(ctx)
		m.calls.observe(scope, OpRollback, start, rerr)
		m.cfg.Metrics.Observe(scope, OutcomeReleased)
		if rerr != nil {
			m.cfg.Logger.Error("Dedup inbox rollback failed", rerr, m.fields(msg, scope, keys))
		}
	}()
	outputs, err = h(msg)
	if err != nil {
		return nil, err
	}
	data := m.encode(msg, outputs)
	start = m.calls.now()
	cctx, cancel := m.calls.ctx(parent, true)
	err = tx.Commit(cctx, data)
	cancel()
	m.calls.observe(scope, OpCommit, start, err)
	if err != nil {
		// Not committed: neither the effect nor the record exists. Nack.
		m.cfg.Metrics.Observe(scope, OutcomeStoreError)
		return nil, fmt.Errorf("%w: commit of message %s, scope %q: %w", ErrStore, keyfuncs.Name(msg), scope, err)
	}
	committed = true
	return outputs, nil
}
