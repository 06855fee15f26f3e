package middleware

import (
	"context"
	"fmt"
	"time"

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
	if cfg.Mode == dedup.ModeAsyncComplete {
		m.async = newPending(cyc.Policy().Tuning.CompleteLinger)
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
		if m.cfg.Mode == dedup.ModeTransactional {
			return m.handleTx(h, msg, scope, keys)
		}
		return m.handleLease(h, msg, scope, keys)
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

// checkTTL counts and logs a claimed message older than Retention: if it
// was handled before, its record has expired and it runs again.
func (m *Middleware) checkTTL(msg *message.Message, scope string, keys []string) {
	if m.cfg.PublishedAt == nil {
		return
	}
	at, ok := m.cfg.PublishedAt(msg)
	if !ok {
		return
	}
	retention := m.cyc.Policy().Retention
	if age := time.Since(at); age > retention {
		m.cyc.Observe(scope, dedup.OutcomeTTLMiss)
		f := m.cyc.Fields(msg, scope, keys)
		f["age"] = age.String()
		f["retention"] = retention.String()
		m.cyc.Logger().Error("Message is older than the dedup retention window: if it was handled before, its record has expired and it runs again (ttl_miss)", fmt.Errorf("dedup: message older than the retention window: published %s ago, retention %s", age, retention), f)
	}
}

// encode is the data a done record keeps for msg and the handler's
// outputs.
func (m *Middleware) encode(msg *message.Message, outputs []*message.Message) []byte {
	var fp []byte
	if m.cfg.Fingerprint != nil {
		fp = m.cfg.Fingerprint(msg)
	}
	return m.cyc.Encode(fp, outputs)
}

// duplicate acks a message that was already done, re-emitting its stored
// outputs.
func (m *Middleware) duplicate(msg *message.Message, scope string, keys []string, data []byte) ([]*message.Message, error) {
	return m.cyc.Duplicate(msg, scope, keys, data, m.cfg.Fingerprint)
}
