package publisher

import (
	"context"
	"time"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// The store calls of the publisher, each bounded by StoreTimeout and
// timed for Metrics. Calls that must happen after the publish (Complete,
// Release, Commit, Rollback) are detached from the message's
// cancellation, so a cancelled message still releases its claim.

func (d *Decorator) ctx(parent context.Context, detach bool) (context.Context, context.CancelFunc) {
	if detach {
		parent = context.WithoutCancel(parent)
	}
	if d.noTimeout {
		return parent, func() {}
	}
	return context.WithTimeout(parent, d.cfg.StoreTimeout)
}

func (d *Decorator) now() time.Time {
	if !d.timed {
		return time.Time{}
	}
	return time.Now()
}

func (d *Decorator) observe(scope, op string, start time.Time, err error) {
	if d.timed {
		d.cfg.Metrics.ObserveStore(scope, op, time.Since(start), err)
	}
}

func (d *Decorator) claim(parent context.Context, scope string, keys []string) (*stores.Claim, error) {
	ctx, cancel := d.ctx(parent, false)
	defer cancel()
	start := d.now()
	c, err := d.cfg.Store.Claim(ctx, scope, keys, d.cfg.Lease)
	d.observe(scope, middleware.OpClaim, start, err)
	return c, err
}

func (d *Decorator) release(parent context.Context, c *stores.Claim) error {
	ctx, cancel := d.ctx(parent, true)
	defer cancel()
	start := d.now()
	err := d.cfg.Store.Release(ctx, c)
	d.observe(c.Scope, middleware.OpRelease, start, err)
	return err
}

func (d *Decorator) completeOnce(parent context.Context, c *stores.Claim) error {
	ctx, cancel := d.ctx(parent, true)
	defer cancel()
	start := d.now()
	err := d.cfg.Store.Complete(ctx, c, d.cfg.Window, nil)
	d.observe(c.Scope, middleware.OpComplete, start, err)
	return err
}

// begin is bounded by the message's context only: it works in the
// caller's transaction, where it waits for a concurrent transaction that
// published the same key to end, and a cancelled statement would end the
// caller's connection with it.
func (d *Decorator) begin(parent context.Context, scope string, keys []string) (stores.InboxTx, error) {
	start := d.now()
	tx, err := d.inbox.Begin(parent, scope, keys, d.cfg.Window)
	d.observe(scope, middleware.OpBegin, start, err)
	return tx, err
}

func (d *Decorator) commit(parent context.Context, scope string, tx stores.InboxTx) error {
	ctx, cancel := d.ctx(parent, true)
	defer cancel()
	start := d.now()
	err := tx.Commit(ctx, nil)
	d.observe(scope, middleware.OpCommit, start, err)
	return err
}

func (d *Decorator) rollback(parent context.Context, scope string, tx stores.InboxTx) error {
	ctx, cancel := d.ctx(parent, true)
	defer cancel()
	start := d.now()
	err := tx.Rollback(ctx)
	d.observe(scope, middleware.OpRollback, start, err)
	return err
}
