package middleware_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// gatedStore holds every Complete until open is closed (or the call's
// context ends), announcing each on entered.
type gatedStore struct {
	stores.Store
	entered chan string
	open    chan struct{}
}

// Capabilities are memstore's, but for NonBlocking: a gated Complete
// blocks, and ModeAsyncComplete completes in the background only on a
// store that may.
func (g *gatedStore) Capabilities() stores.Capabilities { return mayBlock(g.Store.Capabilities()) }

func newGatedStore(t testing.TB) *gatedStore {
	return &gatedStore{Store: newMemstore(t), entered: make(chan string, 100), open: make(chan struct{})}
}

func (g *gatedStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	g.entered <- c.Keys[0]
	select {
	case <-g.open:
		return g.Store.Complete(ctx, c, retention, data)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeNow closes m with a context already done.
func closeNow(m *middleware.Middleware) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return m.Close(ctx)
}

type inboxStub struct{ stores.Store }

func (inboxStub) Begin(context.Context, string, []string, time.Duration) (stores.InboxTx, error) {
	return nil, errors.New("not used")
}

// Capabilities are the wrapped store's, with the inbox.
func (s inboxStub) Capabilities() stores.Capabilities {
	c := s.Store.Capabilities()
	c.Inbox = true
	return c
}

func TestAsyncCompleteConfig(t *testing.T) {
	// The mode is one value: transactional and async complete cannot both
	// be asked for, and an unknown mode is refused.
	cfg := middleware.Config{Store: inboxStub{newMemstore(t)}, Mode: dedup.ModeTransactional + 1}
	if err := cfg.Validate(); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("Mode %s: err = %v, want ErrInvalidConfig", cfg.Mode, err)
	}
	// Close is a no-op outside ModeAsyncComplete.
	for _, mode := range []dedup.Mode{dedup.ModeLease, dedup.ModeTransactional} {
		m, err := middleware.New(middleware.Config{Store: inboxStub{newMemstore(t)}, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		if err := closeNow(m); err != nil {
			t.Fatalf("%s: Close = %v, want nil", mode, err)
		}
	}
}

func TestAsyncCompleteAcksFirstAndCloseWaits(t *testing.T) {
	store := newGatedStore(t)
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	runs := 0
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) {
		runs++
		return []*message.Message{message.NewMessage("out-1", []byte("points"))}, nil
	})

	// The handler's result comes back while its Complete is still held.
	out, err := h(message.NewMessage("m-1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("first delivery: out = %v, err = %v; want out-1 acked", out, err)
	}
	if k := <-store.entered; k != "m-1" {
		t.Fatalf("Complete of %q, want m-1", k)
	}
	// A duplicate in the window before the Complete lands waits for this
	// middleware's own Complete (as it would have in ModeLease, where the
	// first delivery's ack waited for it) instead of being nacked as in
	// progress and redelivered after the broker's nack delay.
	type result struct {
		out []*message.Message
		err error
	}
	dup := make(chan result, 1)
	go func() {
		out, err := h(message.NewMessage("m-1", nil))
		dup <- result{out, err}
	}()
	closed := make(chan error, 1)
	go func() { closed <- m.Close(context.Background()) }()
	select {
	case r := <-dup:
		t.Fatalf("the duplicate returned (%v, %v) before the Complete landed", r.out, r.err)
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a Complete was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(store.open)
	if r := <-dup; r.err != nil || len(r.out) != 1 || r.out[0].UUID != "out-1" || runs != 1 {
		t.Fatalf("duplicate during the Complete: out = %v, err = %v, runs = %d; want the recorded out-1 and 1 run", r.out, r.err, runs)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}

	// Landed: a duplicate now is acked with the recorded outputs.
	out, err = h(message.NewMessage("m-1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-1" || runs != 1 {
		t.Fatalf("duplicate after Close: out = %v, err = %v, runs = %d; want the recorded out-1 and 1 run", out, err, runs)
	}
	// After Close, a message completes before it is acked.
	if _, err := h(message.NewMessage("m-2", nil)); err != nil {
		t.Fatal(err)
	}
	c, err := store.Claim(context.Background(), "s", []string{"m-2"}, time.Minute)
	if err != nil || c.Result != stores.Duplicate {
		t.Fatalf("m-2 after Close: %+v, %v; want its record done when the handler returned", c, err)
	}
}

func TestAsyncCloseGivesUpAtItsDeadline(t *testing.T) {
	store := newGatedStore(t) // never opened
	metrics := &testkit.Metrics{}
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Metrics: metrics}})
	if _, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	<-store.entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := m.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want DeadlineExceeded", err)
	}
	// The Complete was stopped (goleak checks its goroutine is gone) and
	// reported; the record stays processing until its lease expires.
	if metrics.Outcome(dedup.OutcomeStoreError) != 1 {
		t.Fatalf("store errors = %d, want the abandoned Complete counted", metrics.Outcome(dedup.OutcomeStoreError))
	}
	c, err := store.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.InProgress {
		t.Fatalf("claim after an abandoned Complete: %+v, %v; want InProgress", c, err)
	}
}

func TestAsyncCompleteOnRouterEveryEffectOnce(t *testing.T) {
	store := newMemstore(t)
	l := newLedger()
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Policy: dedup.Policy{InProgressWait: 5 * time.Second, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}})
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	r.AddNoPublisherHandler("async", "in", ps, func(msg *message.Message) error {
		l.apply(msg.UUID)
		return nil
	}).AddMiddleware(m.Middleware)
	testkit.RunRouter(t, r)

	var ids []string
	for i := range 200 {
		id := "m-" + strconv.Itoa(i)
		ids = append(ids, id)
		// Every message twice, back to back: the copy often lands in the
		// window before the first copy's Complete.
		testkit.Publish(t, ps, "in", message.NewMessage(id, nil), message.NewMessage(id, nil))
	}
	testkit.WaitFor(t, 10*time.Second, "200 events applied", func() bool { return l.distinct() == 200 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.assertExactlyOnce(t, ids)
	for _, id := range ids {
		c, err := store.Claim(context.Background(), "async", []string{id}, time.Minute)
		if err != nil || c.Result != stores.Duplicate {
			t.Fatalf("%s after Close: %+v, %v; want done", id, c, err)
		}
	}
}

// TestAsyncDuplicateOfAnotherConsumerIsInProgress: only this middleware's
// own Completes are waited for; keys another consumer holds are in
// progress, as in ModeLease.
func TestAsyncDuplicateOfAnotherConsumerIsInProgress(t *testing.T) {
	store := newGatedStore(t)
	first := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	second := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	if _, err := first.Middleware(ok)(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	<-store.entered
	if _, err := second.Middleware(ok)(message.NewMessage("m-1", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate of another consumer's run: %v, want ErrInProgress", err)
	}
	close(store.open)
}

// nonBlockingStore is a store that answers without a round trip (as
// memstore does), recording whether a Complete has run.
type nonBlockingStore struct {
	stores.Store
	completed atomic.Bool
}

// Capabilities are memstore's: NonBlocking.
func (s *nonBlockingStore) Capabilities() stores.Capabilities {
	c := s.Store.Capabilities()
	c.NonBlocking = true
	return c
}

func (s *nonBlockingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	s.completed.Store(true)
	return s.Store.Complete(ctx, c, retention, data)
}

// TestAsyncOnNonBlockingStoreCompletesInline: a store that answers without
// a round trip has no latency to hide; completing in the background would
// only add a goroutine and a window for duplicates. The record is done
// when the handler's result comes back.
func TestAsyncOnNonBlockingStoreCompletesInline(t *testing.T) {
	store := &nonBlockingStore{Store: newMemstore(t)}
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	for i := range 100 {
		store.completed.Store(false)
		if _, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-"+strconv.Itoa(i), nil)); err != nil {
			t.Fatal(err)
		}
		if !store.completed.Load() {
			t.Fatalf("message %d: acked before its Complete ran on a non-blocking store", i)
		}
	}
}

// heldClaimStore holds the reply of the Claims it is told to hold, after
// the store has answered them.
type heldClaimStore struct {
	*gatedStore
	hold     atomic.Bool
	answered chan *stores.Claim
	release  chan struct{}
}

func newHeldClaimStore(t testing.TB) *heldClaimStore {
	return &heldClaimStore{gatedStore: newGatedStore(t), answered: make(chan *stores.Claim, 1), release: make(chan struct{})}
}

// duplicate sends a delivery of id through h, s holding the reply of its
// claim, checks that the claim found id in progress, and returns where
// h's error arrives.
func (s *heldClaimStore) duplicate(t *testing.T, h message.HandlerFunc, id string) <-chan error {
	t.Helper()
	s.hold.Store(true)
	res := make(chan error, 1)
	go func() { _, err := h(message.NewMessage(id, nil)); res <- err }()
	if c := <-s.answered; c.Result != stores.InProgress {
		t.Fatalf("the duplicate's claim = %s, want in progress", c.Result)
	}
	return res
}

func (s *heldClaimStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c, err := s.gatedStore.Claim(ctx, scope, keys, lease)
	if s.hold.CompareAndSwap(true, false) {
		s.answered <- c
		<-s.release
	}
	return c, err
}

// TestAsyncDuplicateRacingItsComplete: the store reads the record as
// processing, then this middleware's Complete lands before the duplicate
// looks for it. The duplicate claims once more and is acked, not nacked.
func TestAsyncDuplicateRacingItsComplete(t *testing.T) {
	store := newHeldClaimStore(t)
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	<-store.entered
	dup := store.duplicate(t, h, "m-1")
	close(store.open)
	if err := m.Close(context.Background()); err != nil { // the Complete has landed
		t.Fatal(err)
	}
	close(store.release)
	if err := <-dup; err != nil {
		t.Fatalf("a duplicate whose Complete landed under its claim: %v, want acked", err)
	}
}

// TestAsyncCloseWithNothingPending: Close with a context already done
// returns nil when no Complete is in flight: there was nothing to wait for.
func TestAsyncCloseWithNothingPending(t *testing.T) {
	for i := range 50 {
		m, err := middleware.New(middleware.Config{Store: newGatedStore(t), Mode: dedup.ModeAsyncComplete})
		if err != nil {
			t.Fatal(err)
		}
		if err := closeNow(m); err != nil {
			t.Fatalf("attempt %d: Close with nothing pending = %v, want nil", i, err)
		}
	}
}

// holdElsewhere claims keys directly on store, as another consumer whose
// run holds them would.
func holdElsewhere(t *testing.T, store stores.Store, keys ...string) {
	t.Helper()
	c, err := store.Claim(context.Background(), "s", keys, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("the other consumer's claim: %+v, %v", c, err)
	}
}

// TestAsyncDuplicateOfAnotherConsumerClaimsOnce: under ModeAsyncComplete
// a duplicate whose keys another consumer holds, while none of this
// middleware's own Completes is on its way or has landed, costs one claim,
// as in ModeLease: there is nothing of its own to wait for or to claim
// again after.
func TestAsyncDuplicateOfAnotherConsumerClaimsOnce(t *testing.T) {
	gated := newGatedStore(t)
	store := &claimCounter{Store: gated}
	holdElsewhere(t, gated, "m-1")
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	if _, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate of another consumer's run: %v, want ErrInProgress", err)
	}
	if n := store.count(); n != 1 {
		t.Fatalf("%d claims for one duplicate of another consumer's run, want 1", n)
	}
}

// TestAsyncDuplicateClaimsOnceMoreAfterALanding: a Complete of this
// middleware's own lands between the store reading a duplicate's keys as
// in progress and the duplicate looking for its own Complete of them: it
// may have been theirs, so the duplicate claims once more. When another
// consumer holds them, that claim finds them in progress still, and the
// duplicate is in progress after those two claims, not claiming again.
func TestAsyncDuplicateClaimsOnceMoreAfterALanding(t *testing.T) {
	held := newHeldClaimStore(t)
	store := &claimCounter{Store: held}
	holdElsewhere(t, held.gatedStore, "m-1")
	// A claim loop, were there one, would end at CompleteTimeout: the
	// duplicate's wait for its own Complete.
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 5 * time.Second}}})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-2", nil)); err != nil {
		t.Fatal(err)
	}
	<-held.entered // m-2's Complete is on its way

	res := held.duplicate(t, h, "m-1")
	close(held.open)
	if err := m.Close(context.Background()); err != nil { // m-2's Complete has landed
		t.Fatal(err)
	}
	before := store.count()
	close(held.release)
	if err := <-res; !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate of another consumer's run: %v, want ErrInProgress", err)
	}
	if n := store.count() - before; n != 1 {
		t.Fatalf("%d claims after the landing, want 1", n)
	}
}

// TestAsyncDuplicateWaitsUpToCompleteTimeout: a duplicate waits for this
// middleware's own Complete of its keys for Tuning.CompleteTimeout, not
// for as long as that Complete takes: here a store call that hangs until
// StoreTimeout, 200 times longer. The duplicate is in progress while the
// Complete is still on its way, which Close, given up on at once, reports.
func TestAsyncDuplicateWaitsUpToCompleteTimeout(t *testing.T) {
	store := newGatedStore(t) // never opened: the Complete hangs
	m := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{
		StoreTimeout: 10 * time.Second,
		Tuning:       dedup.Tuning{CompleteTimeout: 50 * time.Millisecond},
	}})
	h := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	<-store.entered
	if _, err := h(message.NewMessage("m-1", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("a duplicate while its Complete hangs: %v, want ErrInProgress", err)
	}
	if err := closeNow(m); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close = %v, want Canceled: the duplicate came back only once the Complete had ended", err)
	}
}
