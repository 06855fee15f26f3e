package cycle_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

// TestClaimCutByItsMessage: the message's context ends while the store
// holds its claim. Claim returns the context's error at once, without
// waiting for the store; once the store answers, the claim it made is
// released, and no key stays held for a lease. A claim whose context
// stays alive is kept. On the bubble's clock, "at once" is before any
// time passes.
func TestClaimCutByItsMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		gate := make(chan struct{})
		e.store.claim = func(n int) (*stores.Claim, error) {
			if n == 1 {
				<-gate
			}
			return nil, nil // the memstore's answer
		}
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{Heartbeat: -1}}, cycle.Needs{})
		claim := func(ctx context.Context, key string) <-chan claimed {
			done := make(chan claimed, 1)
			go func() {
				cl, err := c.Claim(ctx, "s", []string{key})
				done <- claimed{cl, err}
			}()
			return done
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := claim(ctx, "k")
		synctest.Wait()
		if n := e.store.claims.Load(); n != 1 {
			t.Fatalf("%d claims sent to the store, want 1", n)
		}
		cancel()
		synctest.Wait()
		var got claimed
		select {
		case got = <-done:
		default:
			close(gate)
			t.Fatal("Claim waited for the store after its message's context ended")
		}
		if !errors.Is(got.err, context.Canceled) || got.cl != nil {
			t.Fatalf("Claim cut by its message = %v, %v; want context.Canceled", got.cl, got.err)
		}
		close(gate) // the store claims now, for nobody
		synctest.Wait()
		if _, held := e.state("k"); held || e.store.releases.Load() != 1 {
			t.Fatalf("the claim made for nobody: held %v, %d releases; want it released", held, e.store.releases.Load())
		}

		alive, stop := context.WithCancel(context.Background())
		defer stop()
		done = claim(alive, "alive")
		synctest.Wait()
		select {
		case got = <-done:
		default:
			stop() // lets the Claim return
			t.Fatal("Claim with its context alive did not return the store's answer")
		}
		if got.err != nil || got.cl.Result != stores.Claimed {
			t.Fatalf("Claim with its context alive = %v, %v", got.cl, got.err)
		}
		if st, ok := e.state("alive"); !ok || st != stores.StateProcessing {
			t.Fatalf("the record of a claim whose context stays alive: %v, %v; want processing", st, ok)
		}
		if n := e.store.releases.Load(); n != 1 {
			t.Fatalf("%d releases, want 1: a claim whose context stayed alive was released", n)
		}
	})
}

// claimed is what a Claim returned.
type claimed struct {
	cl  *stores.Claim
	err error
}

// TestClaimAnsweredAsItsMessageEnds: a store that never blocks answers
// while the message's context ends. A claim it made is released and
// Claim reports the context's end; any other answer (a duplicate) is
// reported as it is, and nothing is released.
func TestClaimAnsweredAsItsMessageEnds(t *testing.T) {
	e := newEnv(t)
	e.store.caps = func(c stores.Capabilities) stores.Capabilities { c.NonBlocking = true; return c }
	c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
	cl := e.claimed(c, "done")
	if r, _ := complete(c, context.Background(), newMsg("m"), cl, []byte("out")); r != cycle.Done {
		t.Fatalf("Complete = %v, want Done", r)
	}
	// The store answers, then the context ends, before Claim looks.
	var ctx context.Context
	var cancel context.CancelFunc
	e.store.claim = func(n int) (*stores.Claim, error) {
		defer cancel()
		key := map[int]string{2: "done", 3: "fresh"}[n]
		return e.mem.Claim(context.Background(), "s", []string{key}, time.Minute)
	}
	ctx, cancel = context.WithCancel(context.Background())
	dup, err := c.Claim(ctx, "s", []string{"done"})
	if err != nil || dup == nil || dup.Result != stores.Duplicate {
		t.Fatalf("Claim of a completed key, its context ending meanwhile = %v, %v; want the duplicate", dup, err)
	}
	releases := e.store.releases.Load()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	got, err := c.Claim(ctx, "s", []string{"fresh"})
	if !errors.Is(err, context.Canceled) || got != nil {
		t.Fatalf("Claim made as its context ended = %v, %v; want context.Canceled", got, err)
	}
	if _, held := e.state("fresh"); held || e.store.releases.Load() != releases+1 {
		t.Fatalf("the claim made as its context ended: held %v, %d releases; want released", held, e.store.releases.Load()-releases)
	}
}
