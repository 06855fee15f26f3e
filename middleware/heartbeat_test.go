package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
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

// With the default heartbeat (Lease/3) a handler running for several
// leases keeps its claim: a rival consumer finds the message in progress
// all along.
func TestDefaultHeartbeatKeepsTheLease(t *testing.T) {
	ctx := context.Background()
	// The store's time is the test's: the lease runs out only when the
	// handler moves the clock, which it does by two thirds of a lease
	// once the default heartbeat has extended the lease since the last
	// move, however late the heartbeat came.
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	metrics := &testkit.Metrics{}
	const lease = 600 * time.Millisecond
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: lease, Metrics: metrics}})
	extends := func() int { return metrics.Calls(dedup.OpExtend) }
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		// Run until the lease was extended three times (two leases of
		// the store's time), checking that nobody can take the message
		// meanwhile.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(time.Minute)
		seen := extends()
		for moved := 0; moved < 3; {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the clock moved %d times in a minute, want 3 (%d extensions)", moved, extends())
			}
			<-tick.C
			// An Extend that read the clock after the last move is the
			// second to land since (a claim has one Extend in flight at a
			// time: the first may have begun before the move).
			if extends() >= seen+2 {
				moved++
				clock.Advance(lease * 2 / 3)
				seen = extends()
			}
			c, err := store.Claim(ctx, "s", []string{msg.UUID}, lease)
			if err != nil {
				return nil, err
			}
			if c.Result != stores.InProgress {
				return nil, errors.New("a rival claim got " + c.Result.String() + ": the running handler lost its lease")
			}
		}
		return nil, msg.Context().Err()
	})
	if _, err := h(message.NewMessage("long-1", nil)); err != nil {
		t.Fatal(err)
	}
}

// claimCounter counts the claims that reach a store.
type claimCounter struct {
	stores.Store
	mu     sync.Mutex
	claims int
}

func (c *claimCounter) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c.mu.Lock()
	c.claims++
	c.mu.Unlock()
	return c.Store.Claim(ctx, scope, keys, lease)
}

func (c *claimCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claims
}

// With InProgressWait set and the default InProgressPoll, a delivery that
// finds its message in progress polls until the other run is done, and is
// then acked as a duplicate.
func TestInProgressWaitWithTheDefaultPoll(t *testing.T) {
	store := &claimCounter{Store: newMemstore(t)}
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{InProgressWait: 10 * time.Second}})
	started, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := mw(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-finish
			return nil, nil
		})(message.NewMessage("m-1", nil))
		first <- err
	}()
	<-started
	second := make(chan error, 1)
	ran := make(chan struct{}, 1)
	go func() {
		_, err := mw(func(*message.Message) ([]*message.Message, error) {
			ran <- struct{}{}
			return nil, nil
		})(message.NewMessage("m-1", nil))
		second <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "the second delivery found the message in progress", func() bool { return store.count() >= 2 })
	close(finish)
	if err := <-first; err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second delivery: %v, want a duplicate ack once the first was done", err)
	}
	select {
	case <-ran:
		t.Fatal("the handler ran again for the waiting duplicate")
	default:
	}
}

// A handler whose heartbeat is not due yet is never extended; a lease too
// short for Lease/3 to be a duration has no heartbeat at all.
func TestNoExtendBeforeTheHeartbeatIsDue(t *testing.T) {
	for _, lease := range []time.Duration{time.Hour, 2 * time.Nanosecond} {
		metrics := &testkit.Metrics{}
		mw := dedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Policy: dedup.Policy{Lease: lease, Metrics: metrics}})
		h := mw(func(*message.Message) ([]*message.Message, error) {
			// Long enough for the heartbeat loop to look a few times
			// (it looks at least every 50ms).
			timer := time.NewTimer(200 * time.Millisecond)
			defer timer.Stop()
			<-timer.C
			return nil, nil
		})
		if _, err := h(message.NewMessage("m-1", nil)); err != nil {
			t.Fatalf("lease %s: %v", lease, err)
		}
		n := metrics.Calls(dedup.OpExtend)
		if n != 0 {
			t.Fatalf("lease %s: %d extends in 200ms, want none", lease, n)
		}
	}
}

// TestHeartbeatBesideCompleteOnNATS: on natsstore, whose Extend and
// Complete are compare-and-swaps on the revision they read, a heartbeat
// beating as often as it can beside every Complete never turns the
// Complete into a lost claim: with no other consumer and no outage,
// every message is acked once and every publish is recorded. Before, one
// message in a few hundred was nacked as taken over (and run again after
// the lease), and the publisher published again.
func TestHeartbeatBesideCompleteOnNATS(t *testing.T) {
	store := openStore(t, testkit.StoreParams{Kind: testkit.StoreNATS})
	policy := dedup.Policy{Lease: time.Hour, Logger: watermill.NopLogger{}, Tuning: dedup.Tuning{Heartbeat: time.Nanosecond}}
	t.Run("middleware", func(t *testing.T) {
		m := &testkit.Metrics{}
		p := policy
		p.Metrics = m
		mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "beside", Policy: p})
		h := mw(func(*message.Message) ([]*message.Message, error) {
			time.Sleep(2 * time.Millisecond) // a few heartbeats
			return nil, nil
		})
		for i := range 300 {
			if _, err := h(message.NewMessage(fmt.Sprintf("m-%d", i), nil)); err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
		if n := m.Outcome(dedup.OutcomeLostClaim); n != 0 {
			t.Fatalf("%d lost claims counted", n)
		}
	})
	t.Run("publisher", func(t *testing.T) {
		m := &testkit.Metrics{}
		p := policy
		p.Metrics = m
		d, err := publisher.New(publisher.Config{Store: store, Scope: "beside-pub", Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		var published atomic.Int32
		pub, err := d.Decorate(publisherFunc(func(string, ...*message.Message) error {
			time.Sleep(2 * time.Millisecond)
			published.Add(1)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 300 {
			id := fmt.Sprintf("p-%d", i)
			if err := pub.Publish("t", message.NewMessage(id, nil)); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			// A producer retry right after: a duplicate, not in progress.
			if err := pub.Publish("t", message.NewMessage(id, nil)); errors.Is(err, dedup.ErrInProgress) || err != nil {
				t.Fatalf("retry of publish %d: %v (its record was not written)", i, err)
			}
		}
		if n := published.Load(); n != 300 || m.Outcome(dedup.OutcomeLostClaim) != 0 {
			t.Fatalf("published %d of 300, lost claims %d", n, m.Outcome(dedup.OutcomeLostClaim))
		}
	})
}

// publisherFunc is a message.Publisher of one function.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (publisherFunc) Close() error { return nil }
