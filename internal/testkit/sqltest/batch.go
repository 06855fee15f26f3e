package sqltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Gate holds the batches of a batching store (Batch.MaxInFlight 1) for
// the group commit's tests: the first one (a lone claim, the plug) until
// Open, so that the calls made meanwhile queue behind it in the batcher
// and form the next batch; with HoldNext, the first batch of several
// calls after it too, until OpenNext. The store's tests call Enter where
// a batch begins: sqlstore's through its batch hook, SQLite's through
// mattn/go-sqlite3's authorizer.
type Gate struct {
	t *testing.T
	s *sqlstore.Store

	openOnce, nextOnce sync.Once

	mu          sync.Mutex
	entered     int
	holdNext    bool
	heldNext    bool
	held, open  chan struct{}
	held2, next chan struct{}
}

// NewGate returns a gate for s, opened when t ends (a test that failed
// while it held a batch then closes its store).
func NewGate(t *testing.T, s *sqlstore.Store) *Gate {
	g := &Gate{t: t, s: s, held: make(chan struct{}), open: make(chan struct{}), held2: make(chan struct{}), next: make(chan struct{})}
	t.Cleanup(func() {
		g.Open()
		g.OpenNext()
	})
	return g
}

// HoldNext makes the gate hold the first batch of several calls after
// the plug too.
func (g *Gate) HoldNext() {
	g.mu.Lock()
	g.holdNext = true
	g.mu.Unlock()
}

// Enter is where a batch begins (several: of more than one call): the
// first waits for Open, the first of several after it for OpenNext when
// HoldNext was called.
func (g *Gate) Enter(several bool) {
	g.mu.Lock()
	g.entered++
	first := g.entered == 1
	hold := !first && several && g.holdNext && !g.heldNext
	g.heldNext = g.heldNext || hold
	g.mu.Unlock()
	switch {
	case first:
		close(g.held)
		<-g.open
	case hold:
		close(g.held2)
		<-g.next
	}
}

// Open lets the plug's batch go on.
func (g *Gate) Open() { g.openOnce.Do(func() { close(g.open) }) }

// WaitHeldNext waits until the gate holds the batch of several calls
// after the plug, failing t if none comes.
func (g *Gate) WaitHeldNext() {
	g.t.Helper()
	select {
	case <-g.held2:
	case <-time.After(time.Minute):
		g.t.Fatal("no batch of several calls came after the plug's")
	}
}

// OpenNext lets that batch go on.
func (g *Gate) OpenNext() { g.nextOnce.Do(func() { close(g.next) }) }

// Plug starts a lone claim in scope that the gate holds, and returns once
// it is held; wait for it with the returned function after Open.
func (g *Gate) Plug(ctx context.Context, scope string) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := g.s.Claim(ctx, scope, []string{"plug-" + storetest.NewID()}, time.Minute); err != nil {
			g.t.Errorf("plug claim: %v", err)
		}
	}()
	<-g.held
	return func() { <-done }
}

// Queued waits until n calls besides the plug wait in the batcher's
// queue (not merely inside the batcher: a call on its way to the queue
// may be held there by a loaded machine for any time), however long they
// take to get there.
func (g *Gate) Queued(n int) {
	testkit.WaitFor(g.t, time.Minute, fmt.Sprintf("%d calls waiting in the batcher's queue", n), func() bool {
		return testkit.WaitingInBatcher() >= n
	})
}

// RunBatchSharesStatements: calls made while a batch runs queue and then
// run together, in one batch, each with its own result; then their
// Completes, at once, each with its data. together fails t unless calls
// of at least min ran in one batch.
func RunBatchSharesStatements(t *testing.T, s *sqlstore.Store, g *Gate, together func(min int)) {
	ctx := context.Background()
	wait := g.Plug(ctx, "share")
	const n = 12
	claims := make([]*stores.Claim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { claims[i], errs[i] = s.Claim(ctx, "share", []string{fmt.Sprint("k", i)}, time.Minute) })
	}
	g.Queued(n)
	g.Open()
	wg.Wait()
	wait()
	for i := range n {
		if errs[i] != nil || claims[i].Result != stores.Claimed {
			t.Fatalf("claim %d: %+v %v", i, claims[i], errs[i])
		}
	}
	together(2)
	for i := range n {
		wg.Go(func() { errs[i] = s.Complete(ctx, claims[i], time.Hour, []byte{byte(i), 0, 0xff}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("complete %d: %v", i, errs[i])
		}
		c, err := s.Claim(ctx, "share", []string{fmt.Sprint("k", i)}, time.Minute)
		if err != nil || c.Result != stores.Duplicate || !bytes.Equal(c.Data, []byte{byte(i), 0, 0xff}) {
			t.Fatalf("claim %d after complete: %+v %v", i, c, err)
		}
	}
}

// RunBatchMixed makes the calls of m (PrepareMixed's, prepared before g
// was set up) together in one batch behind g's plug and checks each
// result.
func RunBatchMixed(t *testing.T, m *Mixed, g *Gate) {
	wait := g.Plug(context.Background(), m.Scope)
	m.Run(t, func(calls int) {
		g.Queued(calls)
		g.Open()
	})
	wait()
}

// RunBatchOrphanedClaimReleased: a caller that gives up while its batch
// runs gets its context's error, and the claim the batch made for it is
// released, so the next delivery is not held up for a lease.
func RunBatchOrphanedClaimReleased(t *testing.T, s *sqlstore.Store, g *Gate) {
	g.HoldNext()
	ctx := context.Background()
	wait := g.Plug(ctx, "orphan")
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var gaveUp, other error
	var otherClaim *stores.Claim
	left := make(chan struct{})
	wg.Go(func() {
		defer close(left)
		_, gaveUp = s.Claim(cctx, "orphan", []string{"orphan"}, time.Hour)
	})
	wg.Go(func() { otherClaim, other = s.Claim(ctx, "orphan", []string{"other"}, time.Hour) })
	g.Queued(2)
	g.Open()
	g.WaitHeldNext() // both run in the next batch, held before its statements
	cancel()
	<-left // the caller left while its batch is held
	g.OpenNext()
	wg.Wait()
	wait()
	if !errors.Is(gaveUp, context.Canceled) {
		t.Fatalf("the caller that gave up got %v, want context.Canceled", gaveUp)
	}
	if other != nil || otherClaim.Result != stores.Claimed {
		t.Fatalf("the other caller: %+v %v", otherClaim, other)
	}
	testkit.WaitFor(t, time.Minute, "the orphaned claim released", func() bool {
		c, err := s.Claim(ctx, "orphan", []string{"orphan"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return c.Result == stores.Claimed
	})
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
