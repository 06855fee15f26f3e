package publisher

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
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
			d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
			d.cfg.Logger.Error("Dedup: transactional publish without its transaction: nothing published", err, d.fields(items[i].msg, scope, items[i].keys))
			return err
		}
	}
	for i := range items {
		it := &items[i]
		if it.dupOf >= 0 {
			continue
		}
		tx, err := d.begin(it.msg.Context(), scope, it.keys)
		if err != nil {
			return errors.Join(d.beginFailed(scope, it, err), d.rollbackAll(scope, items))
		}
		switch tx.Result() {
		case stores.Claimed:
			it.tx, it.send = tx, true
		case stores.InProgress:
			// A lease-mode claim sharing the table holds a key.
			d.cfg.Metrics.Observe(scope, middleware.OutcomeInProgress)
			return errors.Join(fmt.Errorf("%w: message %s, scope %q, keys %q", ErrInProgress, keyfuncs.Name(it.msg), scope, it.keys), d.rollbackAll(scope, items))
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
		if err := d.commit(it.msg.Context(), scope, tx); err != nil {
			d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
			return errors.Join(fmt.Errorf("%w: publish: message %s, scope %q: the record could not be kept in the transaction; roll it back: %w", middleware.ErrStore, keyfuncs.Name(it.msg), scope, err), d.rollbackAll(scope, items))
		}
	}
	return nil
}

// beginFailed counts and wraps a Begin that failed.
func (d *Decorator) beginFailed(scope string, it *item, err error) error {
	if errors.Is(err, stores.ErrInvalidKey) {
		return d.permanent(it.msg, scope, it.keys, middleware.OutcomeNoKey, fmt.Errorf("dedup: publish: scope %q: %w: message %s: %w", scope, keyfuncs.ErrNoKey, keyfuncs.Name(it.msg), err))
	}
	if cerr := it.msg.Context().Err(); cerr != nil {
		d.cfg.Metrics.Observe(scope, middleware.OutcomeCancelled)
		return fmt.Errorf("dedup: publish: scope %q: message %s: its context ended before the store answered: %w", scope, keyfuncs.Name(it.msg), errors.Join(cerr, err))
	}
	d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
	return fmt.Errorf("%w: publish: message %s, scope %q: %w", middleware.ErrStore, keyfuncs.Name(it.msg), scope, err)
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
		if err := d.rollback(it.msg.Context(), scope, tx); err != nil {
			d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
			errs = append(errs, fmt.Errorf("dedup: publish: rolling back the record of message %s: %w", keyfuncs.Name(it.msg), err))
			continue
		}
		d.cfg.Metrics.Observe(scope, middleware.OutcomeReleased)
	}
	return errors.Join(errs...)
}
