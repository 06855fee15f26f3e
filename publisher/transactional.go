package publisher

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// publishTx is the flow of ModeTransactional: every message's record is
// inserted under a savepoint of the transaction its context carries, the
// decorated publisher writes the new messages in the same transaction,
// and the savepoints are released (or, when the publish fails, rolled
// back) in reverse order, so that the caller's commit writes records and
// outbox rows together. The messages are handled one after the other:
// they share a transaction.
func (d *Decorator) publishTx(pub message.Publisher, topic, scope string, items []item) error {
	var first any
	for i := range items {
		tx, ok := d.joiner.JoinedTx(items[i].msg.Context())
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("%w: message %s, scope %q", ErrNoTransaction, keyfuncs.Name(items[i].msg), scope)
		case i == 0:
			first = tx
		case tx != first:
			// The publisher writes every message into one transaction: a
			// record committed with another one could outlive its row.
			err = fmt.Errorf("%w: message %s, scope %q, carries another transaction than message %s of the same call: publish each transaction's messages in a call of their own", ErrNoTransaction, keyfuncs.Name(items[i].msg), scope, keyfuncs.Name(items[0].msg))
		}
		if err != nil {
			d.cyc.Observe(scope, dedup.OutcomeStoreError)
			d.cyc.Logger().Error("Dedup: transactional publish without its transaction: nothing published", err, d.cyc.Fields(items[i].msg, scope, items[i].keys))
			return err
		}
	}
	for i := range items {
		it := &items[i]
		if it.dupOf >= 0 {
			continue
		}
		tx, err := d.cyc.Begin(it.msg.Context(), scope, it.keys)
		var r stores.Result
		if err == nil {
			r = tx.Result()
		}
		// FailOpen is refused with ModeTransactional: never a Bypass.
		switch v, err := d.cyc.Decide(it.msg, scope, it.keys, r, false, err); v {
		case cycle.Run:
			it.tx, it.send = tx, true
		case cycle.Skip:
		case cycle.Busy:
			// A lease-mode claim sharing the table holds a key.
			return errors.Join(d.cyc.InProgress(it.msg, scope, it.keys), d.rollbackAll(scope, items))
		default:
			if tx != nil {
				_ = tx.Rollback(context.WithoutCancel(it.msg.Context()))
			}
			return errors.Join(err, d.rollbackAll(scope, items))
		}
	}
	send := d.toSend(scope, items)
	if len(send) == 0 {
		return nil
	}
	err := guarded(pub, topic, send, func() { _ = d.rollbackAll(scope, items) })
	if err != nil {
		return errors.Join(fmt.Errorf("dedup: publish: %d message(s) to topic %q failed (their records rolled back to their savepoints): %w", len(send), topic, err), d.rollbackAll(scope, items))
	}
	for i := len(items) - 1; i >= 0; i-- {
		it := &items[i]
		if it.tx == nil {
			continue
		}
		tx := it.tx
		it.tx = nil
		if err := d.cyc.Commit(it.msg.Context(), scope, tx, d.cyc.EncodeFor(it.msg, nil)); err != nil {
			d.cyc.Observe(scope, dedup.OutcomeStoreError)
			return errors.Join(fmt.Errorf("%w: publish: message %s, scope %q: the record could not be kept in the transaction; roll it back: %w", dedup.ErrStore, keyfuncs.Name(it.msg), scope, err), d.rollbackAll(scope, items))
		}
	}
	return nil
}

// rollbackAll rolls back every open inbox transaction of the call, the
// latest savepoint first.
func (d *Decorator) rollbackAll(scope string, items []item) error {
	var errs []error
	for i := len(items) - 1; i >= 0; i-- {
		it := &items[i]
		if it.tx == nil {
			continue
		}
		tx := it.tx
		it.tx, it.send = nil, false
		if err := d.cyc.Rollback(it.msg.Context(), scope, tx); err != nil {
			d.cyc.Observe(scope, dedup.OutcomeStoreError)
			errs = append(errs, fmt.Errorf("dedup: publish: rolling back the record of message %s: %w", keyfuncs.Name(it.msg), err))
			continue
		}
		d.cyc.Observe(scope, dedup.OutcomeReleased)
	}
	return errors.Join(errs...)
}
