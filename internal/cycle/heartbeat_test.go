package cycle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
)

func TestHeartbeat(t *testing.T) {
	beat := dedup.Policy{Lease: time.Hour, Tuning: dedup.Tuning{Heartbeat: time.Millisecond}}
	t.Run("extends until dropped", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, beat, cycle.Needs{})
		cl := e.claimed(c, "k")
		parent := context.WithValue(context.Background(), txKey{}, "v")
		b := c.Hold(parent, cl)
		if got, ok := cycle.ClaimFromContext(b); !ok || got != cl {
			t.Fatal("the beat does not carry the claim")
		}
		if b.Value(txKey{}) != "v" {
			t.Fatal("the beat lost the parent's values")
		}
		testkit.WaitFor(t, 10*time.Second, "two extensions", func() bool { return e.store.extends.Load() >= 2 })
		if b.Err() != nil {
			t.Fatalf("a held beat is done: %v", b.Err())
		}
		c.Drop(b)
		n := e.store.extends.Load()
		// The loop ticks every half heartbeat: a few ticks would extend.
		testkit.WaitFor(t, 10*time.Second, "the beat's context to end", func() bool { return b.Err() != nil })
		time.Sleep(20 * time.Millisecond)
		if m := e.store.extends.Load(); m != n {
			t.Fatalf("%d extensions after Drop", m-n)
		}
		if _, ok := cycle.ClaimFromContext(context.Background()); ok {
			t.Fatal("a context without a claim has one")
		}
	})
	t.Run("lost lease cancels the effect", func(t *testing.T) {
		e := newEnv(t)
		e.store.extend = func(int) error { return stores.ErrLostClaim }
		c := e.cycle(cycle.Consumer, beat, cycle.Needs{})
		b := c.Hold(context.Background(), e.claimed(c, "k"))
		defer c.Drop(b)
		select {
		case <-b.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the beat's context was not cancelled after the lease was lost")
		}
		if !errors.Is(context.Cause(b), stores.ErrLostClaim) || e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 || !strings.Contains(e.errorLogs(), "lease lost while the handler runs") {
			t.Fatalf("cause %v, lost_claim %d, log %q", context.Cause(b), e.metrics.Outcome(dedup.OutcomeLostClaim), e.errorLogs())
		}
		n := e.store.extends.Load()
		time.Sleep(20 * time.Millisecond)
		if e.store.extends.Load() != n {
			t.Fatal("a lost lease was extended again")
		}
	})
	t.Run("refused after the effect: the Complete landed", func(t *testing.T) {
		e := newEnv(t)
		e.store.extend = func(int) error { return stores.ErrLostClaim }
		c := e.cycle(cycle.Producer, beat, cycle.Needs{})
		b := c.Hold(context.Background(), e.claimed(c, "k"))
		b.Completing()
		testkit.WaitFor(t, 10*time.Second, "an extension", func() bool { return e.store.extends.Load() >= 1 })
		c.Drop(b)
		if e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 || e.errorLogs() != "" || !errors.Is(b.Err(), context.Canceled) || errors.Is(context.Cause(b), stores.ErrLostClaim) {
			t.Fatalf("a refusal after Completing was reported as a lost lease: %d, %q, %v", e.metrics.Outcome(dedup.OutcomeLostClaim), e.errorLogs(), context.Cause(b))
		}
	})
	t.Run("failure retried at the next beat", func(t *testing.T) {
		e := newEnv(t)
		e.store.extend = func(n int) error {
			if n == 1 {
				return errReset
			}
			return nil
		}
		c := e.cycle(cycle.Consumer, beat, cycle.Needs{})
		b := c.Hold(context.Background(), e.claimed(c, "k"))
		testkit.WaitFor(t, 10*time.Second, "an extension after the failed one", func() bool { return e.store.extends.Load() >= 3 })
		c.Drop(b)
		if e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "retrying at the next heartbeat") || errors.Is(context.Cause(b), stores.ErrLostClaim) {
			t.Fatalf("store errors %d, log %q", e.metrics.Outcome(dedup.OutcomeStoreError), e.errorLogs())
		}
	})
	t.Run("disabled", func(t *testing.T) {
		// Disabled, or a lease too short for a third of it to be a
		// duration (the default heartbeat is Lease/3).
		for _, p := range []dedup.Policy{{Tuning: dedup.Tuning{Heartbeat: -1}}, {Lease: 2}} {
			e := newEnv(t)
			c := e.cycle(cycle.Consumer, p, cycle.Needs{})
			b := c.Hold(context.Background(), e.claimed(c, "k"))
			time.Sleep(20 * time.Millisecond)
			c.Drop(b)
			if n := e.store.extends.Load(); n != 0 {
				t.Fatalf("%+v: %d extensions with the heartbeat disabled", p.Tuning, n)
			}
		}
	})
	t.Run("timed", func(t *testing.T) {
		// On the bubble's clock. A 10ms heartbeat ticks every 5ms and
		// extends every 10ms, counted from the claim's registration. A
		// 1s heartbeat ticks every 50ms (the bound of a tick), and a claim
		// registered between ticks counts from the last one: extended
		// early, never late.
		for _, tc := range []struct {
			heartbeat, second time.Duration // second: when a second claim registers, 0 for none
			until             time.Duration
			want              []time.Duration
		}{
			{heartbeat: 10 * time.Millisecond, until: 95 * time.Millisecond, want: []time.Duration{10, 20, 30, 40, 50, 60, 70, 80, 90}},
			{heartbeat: time.Second, second: 75500 * time.Microsecond, until: 1060 * time.Millisecond, want: []time.Duration{1000, 1050}},
		} {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				start := time.Now()
				extended := make(chan time.Duration, 100)
				e.store.extend = func(int) error {
					extended <- time.Since(start) / time.Millisecond
					return nil
				}
				c := e.cycle(cycle.Consumer, dedup.Policy{Lease: time.Hour, Tuning: dedup.Tuning{Heartbeat: tc.heartbeat}}, cycle.Needs{})
				held := []*cycle.Beat{c.Hold(context.Background(), e.claimed(c, "k"))}
				if tc.second > 0 {
					time.Sleep(tc.second)
					held = append(held, c.Hold(context.Background(), e.claimed(c, "k2")))
				}
				time.Sleep(tc.until - time.Since(start))
				for _, b := range held {
					c.Drop(b)
				}
				// Idle, the loop exits within a few ticks: a loop left
				// running fails the bubble.
				time.Sleep(time.Second)
				close(extended)
				var at []time.Duration
				for d := range extended {
					at = append(at, d)
				}
				if fmt.Sprint(at) != fmt.Sprint(tc.want) {
					t.Fatalf("heartbeat %s: extensions at %v ms, want %v", tc.heartbeat, at, tc.want)
				}
			})
		}
	})
	t.Run("deadline of the parent", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		at := time.Now().Add(time.Hour)
		parent, cancel := context.WithDeadline(context.Background(), at)
		defer cancel()
		b := c.Hold(parent, e.claimed(c, "k"))
		defer c.Drop(b)
		if d, ok := b.Deadline(); !ok || !d.Equal(at) {
			t.Fatalf("Deadline = %v, %v", d, ok)
		}
		cancel()
		if !errors.Is(b.Err(), context.Canceled) {
			t.Fatalf("the beat did not follow its parent's cancellation: %v", b.Err())
		}
	})
}

// overlapStore reports an Extend of a claim sent while a Complete of it is
// in flight. Its Complete waits, up to a bound, for such an Extend to
// arrive: a store whose fenced writes are compare-and-swaps (natsstore)
// then fails one of the two.
type overlapStore struct {
	*fake
	completing atomic.Bool
	arrived    chan struct{}
	overlaps   atomic.Int32
}

func (s *overlapStore) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	if s.completing.Load() {
		s.overlaps.Add(1)
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	}
	return s.fake.Extend(ctx, c, lease)
}

func (s *overlapStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	s.completing.Store(true)
	defer s.completing.Store(false)
	select {
	case <-s.arrived:
	case <-time.After(50 * time.Millisecond): // no Extend came: the Complete proceeds
	}
	return s.fake.Complete(ctx, c, retention, data)
}

// TestNoExtendBesideComplete: the heartbeat never sends an Extend of a
// claim while a Complete of it is in flight (it waits for the attempt to
// end), whatever the heartbeat, so that a store whose fenced calls are
// compare-and-swaps does not fail the Complete as a lost claim.
func TestNoExtendBesideComplete(t *testing.T) {
	e := newEnv(t)
	store := &overlapStore{fake: e.store, arrived: make(chan struct{}, 1)}
	c, err := cycle.New(store, dedup.Policy{Lease: time.Hour, Tuning: dedup.Tuning{Heartbeat: time.Nanosecond}, Metrics: e.metrics, Logger: e.logger}, cycle.Consumer, cycle.Needs{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		cl, err := c.Claim(context.Background(), "s", []string{fmt.Sprintf("k%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		b := c.Hold(context.Background(), cl)
		testkit.WaitFor(t, 10*time.Second, "a heartbeat", func() bool { return e.store.extends.Load() > 0 })
		b.Completing()
		got, _ := c.Complete(context.Background(), newMsg("m"), b, nil)
		c.Drop(b)
		if got != cycle.Done {
			t.Fatalf("Complete = %v", got)
		}
	}
	if n := store.overlaps.Load(); n != 0 {
		t.Fatalf("%d Extends sent while a Complete of the same claim was in flight", n)
	}
}
