package cycle

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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
//
// The store's call does not end with parent: a claim a store makes after
// the message's context ended (a router cancels its messages' contexts
// as it closes) would hold the keys for a whole lease, and every
// redelivery until then would be in progress. When parent ends first,
// Claim returns its error at once and the claim, if the store makes it,
// is released as soon as the store answers, bounded by StoreTimeout.
func (c *Cycle) Claim(parent context.Context, scope string, keys []string) (*stores.Claim, error) {
	sctx, span := c.span(parent, dedup.OpClaim, scope, keys)
	var (
		cl  *stores.Claim
		err error
	)
	owner := c.owner(parent)
	if c.caps.NonBlocking || parent.Done() == nil {
		// Nothing to wait for: the call is over before parent could end
		// in the middle of it.
		cl, err = c.claim(sctx, scope, keys, owner)
	} else {
		cl, err = c.claimDetached(parent, sctx, scope, keys, owner)
	}
	if err == nil && cl.Result == stores.Claimed && parent.Err() != nil {
		c.releaseCut(sctx, cl)
		cl, err = nil, parent.Err()
	}
	if span != nil {
		c.linkClaim(span, cl, trace.SpanContextFromContext(parent))
		end(span, err, c.claimOutcome(parent, cl, err)...)
	}
	return cl, err
}

// claim is one store Claim, bounded by StoreTimeout within ctx; owner,
// when set, is kept with its records (stores.OwnerClaimer).
func (c *Cycle) claim(ctx context.Context, scope string, keys []string, owner []byte) (*stores.Claim, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	start := c.now()
	var (
		cl  *stores.Claim
		err error
	)
	if owner != nil {
		cl, err = c.tr.owners.ClaimOwned(ctx, scope, keys, c.p.Lease, owner)
	} else {
		cl, err = c.store.Claim(ctx, scope, keys, c.p.Lease)
	}
	c.observe(scope, dedup.OpClaim, start, err)
	return cl, err
}

// claimDetached runs the claim on sctx without its cancellation, and
// returns parent's error as soon as parent ends; the claim the store
// then makes is released when its answer comes.
func (c *Cycle) claimDetached(parent, sctx context.Context, scope string, keys []string, owner []byte) (*stores.Claim, error) {
	var (
		mu  sync.Mutex
		cut bool
		ch  = make(chan claimResult, 1)
	)
	go func() {
		cl, err := c.claim(context.WithoutCancel(sctx), scope, keys, owner)
		mu.Lock()
		defer mu.Unlock()
		if !cut {
			ch <- claimResult{cl, err}
		} else if err == nil && cl.Result == stores.Claimed {
			c.releaseCut(sctx, cl)
		}
	}()
	select {
	case r := <-ch:
		return r.cl, r.err
	case <-parent.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-ch:
		return r.cl, r.err
	default:
		cut = true
		return nil, parent.Err()
	}
}

type claimResult struct {
	cl  *stores.Claim
	err error
}

// releaseCut gives back the keys of a claim whose message's context
// ended while the store made it.
func (c *Cycle) releaseCut(ctx context.Context, cl *stores.Claim) {
	if err := c.release(ctx, cl); err != nil {
		c.p.Logger.Info("Dedup claim of a cancelled message not released: it holds its keys until its lease ends", watermill.LogFields{
			"scope": cl.Scope, "keys": cl.Keys, "error": err.Error()})
	}
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

// complete is one Complete, bounded by StoreTimeout within ctx. When
// runs are linked, the span of a Complete refused as a lost claim is
// handed to lost, with the time the call ended, unless lost already
// holds one: the reconciling claim finds the run it links to
// (linkTaker), and the caller ends it at that time.
func (c *Cycle) complete(ctx context.Context, cl *stores.Claim, data []byte, lost *keptSpan) error {
	sctx, span := c.span(ctx, dedup.OpComplete, cl.Scope, cl.Keys)
	ctx, cancel := c.ctx(sctx)
	defer cancel()
	start := c.now()
	err := c.store.Complete(ctx, cl, c.p.Retention, data)
	c.observe(cl.Scope, dedup.OpComplete, start, err)
	if c.tr.links && lost.span == nil && errors.Is(err, stores.ErrLostClaim) {
		settle(span, err)
		lost.span, lost.at = span, time.Now()
		return err
	}
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
			cl := &stores.Claim{Result: tx.Result(), Data: tx.Data()}
			c.linkClaim(span, cl, trace.SpanContextFromContext(parent))
			attrs = c.claimOutcome(parent, cl, nil)
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
