package middleware

import (
	"context"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// storeCalls makes the middleware's store calls: each bounded by
// StoreTimeout and, when Metrics wants latencies, timed.
type storeCalls struct {
	store   stores.Store
	timeout time.Duration
	metrics Metrics
	// noTimeout: the store never blocks, so per-call timeouts are skipped.
	noTimeout bool
	// timed: Metrics wants store latencies (it is not NopMetrics).
	timed bool
}

func newStoreCalls(cfg Config) storeCalls {
	s := storeCalls{store: cfg.Store, timeout: cfg.StoreTimeout, metrics: cfg.Metrics}
	if cfg.Store.Capabilities().NonBlocking {
		s.noTimeout = true
	}
	if _, nop := cfg.Metrics.(NopMetrics); !nop {
		s.timed = true
	}
	return s
}

// ctx bounds a store call by StoreTimeout. Calls that must happen after
// the handler (Complete, Release, Extend) detach from the message's
// cancellation first, so a cancelled message still releases its claim.
func (s *storeCalls) ctx(parent context.Context, detach bool) (context.Context, context.CancelFunc) {
	if s.noTimeout {
		// A non-blocking store needs neither a deadline nor the message's
		// cancellation; detaching is then just dropping the latter.
		if detach {
			return context.Background(), func() {}
		}
		return parent, func() {}
	}
	if detach {
		parent = context.WithoutCancel(parent)
	}
	return context.WithTimeout(parent, s.timeout)
}

// now returns the time for a store latency measurement, or the zero time
// when nobody observes latencies (time.Now is not free on a hot path).
func (s *storeCalls) now() time.Time {
	if !s.timed {
		return time.Time{}
	}
	return time.Now()
}

func (s *storeCalls) observe(scope, op string, start time.Time, err error) {
	if s.timed {
		s.metrics.ObserveStore(scope, op, time.Since(start), err)
	}
}

func (s *storeCalls) claim(parent context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	ctx, cancel := s.ctx(parent, false)
	defer cancel()
	start := s.now()
	c, err := s.store.Claim(ctx, scope, keys, lease)
	s.observe(scope, OpClaim, start, err)
	return c, err
}

func (s *storeCalls) extend(parent context.Context, c *stores.Claim, lease time.Duration) error {
	ctx, cancel := s.ctx(parent, true)
	defer cancel()
	start := s.now()
	err := s.store.Extend(ctx, c, lease)
	s.observe(c.Scope, OpExtend, start, err)
	return err
}

func (s *storeCalls) release(parent context.Context, c *stores.Claim) error {
	ctx, cancel := s.ctx(parent, true)
	defer cancel()
	start := s.now()
	err := s.store.Release(ctx, c)
	s.observe(c.Scope, OpRelease, start, err)
	return err
}

func (s *storeCalls) complete(parent context.Context, detach bool, c *stores.Claim, retention time.Duration, data []byte) error {
	ctx, cancel := s.ctx(parent, detach)
	defer cancel()
	start := s.now()
	err := s.store.Complete(ctx, c, retention, data)
	s.observe(c.Scope, OpComplete, start, err)
	return err
}
