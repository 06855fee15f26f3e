package cycle

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/stores"
)

// The store calls of the cycle: each bounded by StoreTimeout (but a Begin
// joining the caller's transaction) and, when Metrics wants latencies,
// timed. Calls made after the effect (Complete, Release, Extend, Commit,
// Rollback) are detached from the message's cancellation by their
// callers, so that a cancelled message still records or releases its
// claim; every call keeps its parent's values.

// ctx bounds a store call by StoreTimeout, unless the store never blocks.
func (c *Cycle) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	if c.caps.NonBlocking {
		return parent, func() {}
	}
	return context.WithTimeout(parent, c.p.StoreTimeout)
}

// now returns the time for a store latency measurement, or the zero time
// when nobody observes latencies (time.Now is not free on a hot path).
func (c *Cycle) now() time.Time {
	if !c.timed {
		return time.Time{}
	}
	return time.Now()
}

func (c *Cycle) observe(scope, op string, start time.Time, err error) {
	if c.timed {
		c.p.Metrics.ObserveStore(scope, op, time.Since(start), err)
	}
}

// Claim claims keys in scope for the policy's Lease. parent is the
// message's context (or one the caller derived from it).
func (c *Cycle) Claim(parent context.Context, scope string, keys []string) (*stores.Claim, error) {
	sctx, span := c.span(parent, dedup.OpClaim, scope, keys)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	cl, err := c.store.Claim(ctx, scope, keys, c.p.Lease)
	c.observe(scope, dedup.OpClaim, start, err)
	if span != nil {
		end(span, err, c.claimOutcome(parent, cl, err)...)
	}
	return cl, err
}

func (c *Cycle) extend(parent context.Context, cl *stores.Claim) error {
	sctx, span := c.span(context.WithoutCancel(parent), dedup.OpExtend, cl.Scope, cl.Keys)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := c.store.Extend(ctx, cl, c.p.Lease)
	c.observe(cl.Scope, dedup.OpExtend, start, err)
	end(span, err)
	return err
}

func (c *Cycle) release(parent context.Context, cl *stores.Claim) error {
	sctx, span := c.span(context.WithoutCancel(parent), dedup.OpRelease, cl.Scope, cl.Keys)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := c.store.Release(ctx, cl)
	c.observe(cl.Scope, dedup.OpRelease, start, err)
	end(span, err)
	return err
}

// complete is one Complete, bounded by StoreTimeout within ctx.
func (c *Cycle) complete(ctx context.Context, cl *stores.Claim, data []byte) error {
	sctx, span := c.span(ctx, dedup.OpComplete, cl.Scope, cl.Keys)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := c.store.Complete(ctx, cl, c.p.Retention, data)
	c.observe(cl.Scope, dedup.OpComplete, start, err)
	end(span, err)
	return err
}

// Begin opens the inbox transaction of a message (ModeTransactional). A
// Begin that joins a transaction parent carries is bounded by parent
// only: it waits there for a concurrent transaction holding the same key,
// and a statement cancelled by StoreTimeout would end the caller's
// connection with it. Begin's own transaction it bounds by StoreTimeout:
// a duplicate waiting longer is nacked, and finds the other run's outcome
// when it is redelivered.
func (c *Cycle) Begin(parent context.Context, scope string, keys []string) (stores.InboxTx, error) {
	sctx, span := c.span(parent, dedup.OpBegin, scope, keys)
	ctx, cancel := sctx, context.CancelFunc(func() {})
	if c.joiner == nil {
		ctx, cancel = c.ctx(sctx)
	} else if _, joined := c.joiner.JoinedTx(parent); !joined {
		ctx, cancel = c.ctx(sctx)
	}
	defer cancel()
	start := c.now()
	tx, err := c.inbox.Begin(ctx, scope, keys, c.p.Retention)
	c.observe(scope, dedup.OpBegin, start, err)
	if span != nil {
		var attrs []attribute.KeyValue
		if err == nil {
			attrs = c.claimOutcome(parent, &stores.Claim{Result: tx.Result(), Data: tx.Data()}, nil)
		} else {
			attrs = c.claimOutcome(parent, nil, err)
		}
		end(span, err, attrs...)
	}
	return tx, err
}

// Rollback rolls tx back, detached from parent's cancellation.
func (c *Cycle) Rollback(parent context.Context, scope string, tx stores.InboxTx) error {
	sctx, span := c.span(context.WithoutCancel(parent), dedup.OpRollback, scope, nil)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := tx.Rollback(ctx)
	c.observe(scope, dedup.OpRollback, start, err)
	end(span, err)
	return err
}

func (c *Cycle) commit(parent context.Context, scope string, tx stores.InboxTx, data []byte) error {
	sctx, span := c.span(context.WithoutCancel(parent), dedup.OpCommit, scope, nil)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := tx.Commit(ctx, data)
	c.observe(scope, dedup.OpCommit, start, err)
	end(span, err)
	return err
}
