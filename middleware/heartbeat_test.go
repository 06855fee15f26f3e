package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// hangingExtendStore never answers an Extend: it returns when the call's
// context ends (StoreTimeout), counting the calls in flight.
type hangingExtendStore struct {
	stores.Store
	calls, inFlight, maxInFlight atomic.Int32
}

// Capabilities are the wrapped store's, but it may block (a store that
// never blocks gets no per-call timeouts).
func (s *hangingExtendStore) Capabilities() stores.Capabilities {
	return mayBlock(s.Store.Capabilities())
}

func (s *hangingExtendStore) Extend(ctx context.Context, _ *stores.Claim, _ time.Duration) error {
	s.calls.Add(1)
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.maxInFlight.Load(); n > m && !s.maxInFlight.CompareAndSwap(m, n); m = s.maxInFlight.Load() {
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestHeartbeatOneExtendAtATime: a heartbeat shorter than StoreTimeout
// meets a store that does not answer. Each claim has at most one Extend
// in flight; ticks that come meanwhile are skipped, not queued behind it
// (they piled up, one goroutine per tick, each waiting a StoreTimeout,
// and the middleware waited for all of them before returning).
func TestHeartbeatOneExtendAtATime(t *testing.T) {
	store := &hangingExtendStore{Store: newMemstore(t)}
	const storeTimeout = 300 * time.Millisecond
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: 10 * time.Second, Tuning: dedup.Tuning{Heartbeat: 10 * time.Millisecond}, StoreTimeout: storeTimeout}})
	const handlerRuns = 500 * time.Millisecond // fifty heartbeats
	start := time.Now()
	_, err := mw(func(*message.Message) ([]*message.Message, error) {
		time.Sleep(handlerRuns)
		return nil, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatal(err)
	}
	// However long the claim was really held (a loaded machine oversleeps
	// the handler's 500ms): Extends that each last StoreTimeout (their
	// context's deadline), one at a time, fit in it this many times, plus
	// the one in flight when it ends.
	held := time.Since(start)
	if m := store.maxInFlight.Load(); m != 1 {
		t.Errorf("%d Extends of one claim in flight at once, want 1", m)
	}
	if n, most := store.calls.Load(), int32(held/storeTimeout)+2; n > most {
		t.Errorf("%d Extends for one claim held %s, each hanging %s: at most %d fit one at a time (the ticks meanwhile queued up)", n, held, storeTimeout, most)
	}
}
