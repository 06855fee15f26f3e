package middleware_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

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

func newAsync(t testing.TB, cfg middleware.Config) *middleware.Middleware {
	t.Helper()
	cfg.Mode = middleware.ModeAsyncComplete
	m, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

type inboxStub struct{ stores.Store }

func (inboxStub) Begin(context.Context, string, []string, time.Duration) (stores.InboxTx, error) {
	return nil, errors.New("not used")
}

func TestAsyncCompleteConfig(t *testing.T) {
	// The mode is one value: transactional and async complete cannot both
	// be asked for, and an unknown mode is refused.
	cfg := middleware.Config{Store: inboxStub{newMemstore(t)}, Mode: middleware.ModeTransactional + 1}
	if err := cfg.Validate(); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("Mode %s: err = %v, want ErrInvalidConfig", cfg.Mode, err)
	}
	// Close is a no-op outside ModeAsyncComplete.
	for _, mode := range []middleware.Mode{middleware.ModeLease, middleware.ModeTransactional} {
		m, err := middleware.New(middleware.Config{Store: inboxStub{newMemstore(t)}, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := m.Close(ctx); err != nil {
			t.Fatalf("%s: Close = %v, want nil", mode, err)
		}
	}
}

func TestAsyncCompleteAcksFirstAndCloseWaits(t *testing.T) {
	store := newGatedStore(t)
	m := newAsync(t, middleware.Config{Store: store, Scope: "s"})
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
	// A duplicate in the window before the Complete lands is nacked as in
	// progress, not run again.
	if _, err := h(message.NewMessage("m-1", nil)); !errors.Is(err, middleware.ErrInProgress) || runs != 1 {
		t.Fatalf("duplicate before the Complete: err = %v, runs = %d; want ErrInProgress and 1 run", err, runs)
	}

	closed := make(chan error, 1)
	go func() { closed <- m.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a Complete was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(store.open)
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
	metrics := newCountingMetrics()
	m := newAsync(t, middleware.Config{Store: store, Scope: "s", Metrics: metrics})
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
	if metrics.get(middleware.OutcomeStoreError) != 1 {
		t.Fatalf("store errors = %d, want the abandoned Complete counted", metrics.get(middleware.OutcomeStoreError))
	}
	c, err := store.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.InProgress {
		t.Fatalf("claim after an abandoned Complete: %+v, %v; want InProgress", c, err)
	}
}

func TestAsyncCompleteOnRouterEveryEffectOnce(t *testing.T) {
	store := newMemstore(t)
	l := newLedger()
	m := newAsync(t, middleware.Config{Store: store, InProgressWait: 5 * time.Second, Tuning: middleware.Tuning{InProgressPoll: time.Millisecond}})
	ps := newPubSub(t)
	r := newRouter(t)
	r.AddNoPublisherHandler("async", "in", ps, func(msg *message.Message) error {
		l.apply(msg.UUID)
		return nil
	}).AddMiddleware(m.Middleware)
	runRouter(t, r)

	var ids []string
	for i := range 200 {
		id := "m-" + strconv.Itoa(i)
		ids = append(ids, id)
		// Every message twice, back to back: the copy often lands in the
		// window before the first copy's Complete.
		publish(t, ps, "in", message.NewMessage(id, nil), message.NewMessage(id, nil))
	}
	eventually(t, "200 events applied", func() bool { return l.distinct() == 200 })
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
