package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Middleware is the dedup middleware. Its Middleware method is the
// message.HandlerMiddleware: add it with router.AddMiddleware or
// handler.AddMiddleware, after Watermill's Recoverer and PoisonQueue
// middlewares (inner to them), so a panic is seen, and a permanent error is
// routed, after the claim was released:
//
//	dedupMW, err := middleware.New(middleware.Config{Store: store})
//	...
//	router.AddMiddleware(middleware.Recoverer, poisonQueue, dedupMW.Middleware)
//	...
//	defer dedupMW.Close(ctx) // after the router has stopped
//
// Close matters only for dedup.ModeAsyncComplete, whose Completes run in
// the background; in the other modes it returns at once.
type Middleware struct {
	cfg   Config // as given: cyc.Policy() has the defaults
	cyc   *cycle.Cycle
	key   keyfuncs.KeyFunc
	async *pending // set in ModeAsyncComplete
	// handle is the mode's flow (lease.go, async.go, transactional.go).
	handle func(h message.HandlerFunc, msg *message.Message, scope string, keys []string) ([]*message.Message, error)
}

// New returns the dedup middleware for cfg, or an error wrapping
// dedup.ErrInvalidConfig: an invalid field, or a setting the store cannot
// honour, named with the store's bound.
func New(cfg Config) (*Middleware, error) {
	cyc, err := cfg.cycle()
	if err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, cyc: cyc, key: cycle.Key(cfg.Key)}
	switch cfg.Mode {
	case dedup.ModeTransactional:
		m.handle = m.handleTx
	case dedup.ModeAsyncComplete:
		m.async = newPending(cyc.Policy().Tuning.CompleteLinger)
		m.handle = m.handleAsync
	default:
		m.handle = m.handleLease
	}
	return m, nil
}

// Middleware wraps h in the dedup flow. It is a message.HandlerMiddleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		keys, err := m.key(msg)
		scope := m.scope(msg)
		if err != nil || len(keys) == 0 {
			return nil, m.cyc.NoKey(msg, scope, keys, err)
		}
		return m.handle(h, msg, scope, keys)
	}
}

// Close waits until every Complete started in the background
// (ModeAsyncComplete) has landed or given up (after
// Tuning.CompleteTimeout), or until ctx is done: then the remaining
// retries stop, their records stay processing until their leases expire,
// and Close returns ctx's error once the store calls still in flight have
// returned (each within StoreTimeout). Messages handled after Close
// complete before they are acked, as in ModeLease. In the other modes it
// returns nil at once. It is idempotent.
func (m *Middleware) Close(ctx context.Context) error {
	if m.async == nil {
		return nil
	}
	return m.async.close(ctx)
}

// ClaimFromContext returns the claim the middleware holds for the message
// whose context ctx is, in the lease modes.
func ClaimFromContext(ctx context.Context) (*stores.Claim, bool) {
	return cycle.ClaimFromContext(ctx)
}

func (m *Middleware) scope(msg *message.Message) string {
	if m.cfg.Scope != "" {
		return m.cfg.Scope
	}
	if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
		return name
	}
	return DefaultScope
}
