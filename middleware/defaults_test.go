package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

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
