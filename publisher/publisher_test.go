package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

var errBroker = errors.New("broker said no")

func newMem(t *testing.T, clock stores.Clock) *memstore.Store { return testkit.Memstore(t, clock) }

func decorate(t *testing.T, cfg publisher.Config, pub message.Publisher) message.Publisher {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	d, err := publisher.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p, err := d.Decorate(pub)
	if err != nil {
		t.Fatalf("Decorate: %v", err)
	}
	return p
}

func msg(uuid, payload string) *message.Message {
	return message.NewMessage(uuid, []byte(payload))
}

// TestSixCopiesPublishOnce is Watermill's own Deduplicator publisher
// test: six messages with one payload, one on the topic.
func TestSixCopiesPublishOnce(t *testing.T) {
	rec := &testkit.Recorder{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Key: keyfuncs.PayloadSHA256()}, rec)
	for i := range 6 {
		if err := pub.Publish("topic", msg(watermill.NewUUID(), "same payload")); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if got := len(rec.UUIDs()); got != 1 {
		t.Fatalf("published %d messages, want 1", got)
	}
}

func TestBatchFiltersDuplicates(t *testing.T) {
	rec := &testkit.Recorder{}
	m := &testkit.Metrics{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Policy: dedup.Policy{Metrics: m}}, rec)
	if err := pub.Publish("t", msg("a", "1")); err != nil {
		t.Fatal(err)
	}
	// a: published before; b twice in the call; c once.
	if err := pub.Publish("t", msg("a", "1"), msg("b", "2"), msg("b", "2"), msg("c", "3")); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.UUIDs(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	if rec.Calls() != 2 {
		t.Fatalf("%d publish calls, want 2 (the batch in one call)", rec.Calls())
	}
	if got := m.ScopeOutcome("publish:t", dedup.OutcomeDuplicate); got != 2 {
		t.Fatalf("%d duplicates counted, want 2", got)
	}
	if got := m.ScopeOutcome("publish:t", dedup.OutcomeClaimed); got != 3 {
		t.Fatalf("%d claims counted, want 3", got)
	}
	// Only duplicates: the decorated publisher is not called.
	if err := pub.Publish("t", msg("a", "1"), msg("c", "3")); err != nil {
		t.Fatal(err)
	}
	if rec.Calls() != 2 {
		t.Fatalf("a call of duplicates reached the publisher")
	}
}

func TestScopeIsPerTopic(t *testing.T) {
	rec := &testkit.Recorder{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil)}, rec)
	for _, topic := range []string{"orders", "audit", "orders"} {
		if err := pub.Publish(topic, msg("x", "")); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(rec.UUIDs()); got != 2 {
		t.Fatalf("published %d, want 2 (once per topic)", got)
	}
	rec2 := &testkit.Recorder{}
	pub2 := decorate(t, publisher.Config{Store: newMem(t, nil), Scope: "all"}, rec2)
	for _, topic := range []string{"orders", "audit"} {
		if err := pub2.Publish(topic, msg("x", "")); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(rec2.UUIDs()); got != 1 {
		t.Fatalf("published %d with a shared Scope, want 1", got)
	}
}

// TestFailedPublishReleases: the first publish fails, its claims are
// released, and the caller's retry publishes every message once.
func TestFailedPublishReleases(t *testing.T) {
	rec := &testkit.Recorder{FailNext: 1, Err: errBroker}
	m := &testkit.Metrics{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Policy: dedup.Policy{Metrics: m}}, rec)
	batch := []*message.Message{msg("a", ""), msg("b", "")}
	err := pub.Publish("t", batch...)
	if !errors.Is(err, errBroker) || !strings.Contains(err.Error(), "2 message(s) to topic \"t\" failed (2 claim(s) released") {
		t.Fatalf("first publish: %v, want the broker's error, saying 2 claims were released", err)
	}
	if got := m.ScopeOutcome("publish:t", dedup.OutcomeReleased); got != 2 {
		t.Fatalf("%d released, want 2", got)
	}
	if err := pub.Publish("t", batch...); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := pub.Publish("t", batch...); err != nil {
		t.Fatalf("second retry: %v", err)
	}
	if got, want := rec.UUIDs(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

func TestWindow(t *testing.T) {
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := &testkit.Recorder{}
	pub := decorate(t, publisher.Config{Store: newMem(t, clock), Policy: dedup.Policy{Retention: time.Minute}}, rec)
	publish := func() {
		t.Helper()
		if err := pub.Publish("t", msg("a", "")); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	clock.Advance(59 * time.Second)
	publish()
	if n := len(rec.UUIDs()); n != 1 {
		t.Fatalf("published %d times within the window, want 1", n)
	}
	clock.Advance(2 * time.Second)
	publish()
	if n := len(rec.UUIDs()); n != 2 {
		t.Fatalf("published %d times, want 2 (again after the window)", n)
	}
}

// The error line of a message without a key advises what a producer can
// do: Publish returns the error to its caller, who must fix the message
// or the key function. It advised a poison queue, which is a consumer's.
func TestNoKeyLogAdvisesTheCaller(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Key: keyfuncs.JSON("order_id"), Policy: dedup.Policy{Logger: logger}}, &testkit.Recorder{})
	if err := pub.Publish("t", msg("b", `{"other":1}`)); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("got %v, want ErrNoKey", err)
	}
	errs := logger.Captured()[watermill.ErrorLogLevel]
	if len(errs) != 1 {
		t.Fatalf("logged %d errors, want 1: %+v", len(errs), errs)
	}
	line := errs[0].Msg
	if strings.Contains(strings.ToLower(line), "poison") {
		t.Errorf("logged %q: a poison queue is a consumer's, not a producer's", line)
	}
	for _, w := range []string{"Publish returns the error to its caller", "fix the message or the key function"} {
		if !strings.Contains(line, w) {
			t.Errorf("logged %q, want it to say %q", line, w)
		}
	}
}

func TestNoKeyPublishesNothing(t *testing.T) {
	rec := &testkit.Recorder{}
	m := &testkit.Metrics{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Policy: dedup.Policy{Metrics: m}, Key: keyfuncs.JSON("order_id")}, rec)
	err := pub.Publish("t", msg("a", `{"order_id":"1"}`), msg("b", `{"other":1}`))
	if !errors.Is(err, keyfuncs.ErrNoKey) || !dedup.IsPermanent(err) {
		t.Fatalf("got %v, want a permanent ErrNoKey", err)
	}
	if rec.Calls() != 0 {
		t.Fatal("a call with an unkeyable message reached the publisher")
	}
	if got := m.ScopeOutcome("publish:t", dedup.OutcomeNoKey); got != 1 {
		t.Fatalf("%d no_key counted, want 1", got)
	}
	// The keyable message was not claimed: it publishes on its own.
	if err := pub.Publish("t", msg("a", `{"order_id":"1"}`)); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.UUIDs()); n != 1 {
		t.Fatalf("published %d, want 1", n)
	}
}

// TestInProgress: a key another producer holds fails the publish with
// ErrInProgress, or, with InProgressWait, waits for that producer: its
// Complete makes the message a duplicate, its Release lets it publish.
func TestInProgress(t *testing.T) {
	ctx := context.Background()
	store := newMem(t, nil)
	other := func(key string) *stores.Claim {
		t.Helper()
		c, err := store.Claim(ctx, "publish:t", []string{key}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("other producer's claim: %v %v", c, err)
		}
		return c
	}
	rec := &testkit.Recorder{}
	pub := decorate(t, publisher.Config{Store: store}, rec)
	c := other("a")
	if err := pub.Publish("t", msg("a", ""), msg("b", "")); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("got %v, want ErrInProgress", err)
	}
	if rec.Calls() != 0 {
		t.Fatal("published while a key was in progress")
	}
	// b's claim was released: it is free.
	if err := pub.Publish("t", msg("b", "")); err != nil {
		t.Fatal(err)
	}
	_ = store.Release(ctx, c)

	waiting := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{InProgressWait: 10 * time.Second, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}}, rec)
	for _, end := range []string{"complete", "release"} {
		t.Run(end, func(t *testing.T) {
			key := "w-" + end
			c := other(key)
			before := len(rec.UUIDs())
			done := make(chan error, 1)
			go func() { done <- waiting.Publish("t", msg(key, "")) }()
			// End the other publish once the waiting one has tried.
			deadline := time.Now().Add(10 * time.Second)
			for rec.Calls() == 0 && time.Now().Before(deadline) {
				if c2, err := store.Claim(ctx, "publish:t", []string{key}, time.Minute); err == nil && c2.Result == stores.InProgress {
					break
				}
			}
			var err error
			if end == "complete" {
				err = store.Complete(ctx, c, time.Minute, nil)
			} else {
				err = store.Release(ctx, c)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("waiting publish: %v", err)
			}
			want := before
			if end == "release" {
				want++
			}
			if got := len(rec.UUIDs()); got != want {
				t.Fatalf("published %d, want %d", got-before, want-before)
			}
		})
	}
}

// failingStore fails every Claim with err, and counts Completes.
type failingStore struct {
	stores.Store
	claimErr    error
	completeErr error
}

func (f *failingStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	if f.claimErr != nil {
		return nil, f.claimErr
	}
	return f.Store.Claim(ctx, scope, keys, lease)
}

func (f *failingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if f.completeErr != nil {
		return f.completeErr
	}
	return f.Store.Complete(ctx, c, retention, data)
}

func TestStoreFailures(t *testing.T) {
	outage := fmt.Errorf("%w: connection refused", stores.ErrUnavailable)
	t.Run("fail-closed", func(t *testing.T) {
		rec := &testkit.Recorder{}
		m := &testkit.Metrics{}
		pub := decorate(t, publisher.Config{Store: &failingStore{Store: newMem(t, nil), claimErr: outage}, Policy: dedup.Policy{Metrics: m}}, rec)
		err := pub.Publish("t", msg("a", ""))
		if !errors.Is(err, dedup.ErrStore) || !errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("got %v, want ErrStore wrapping the outage", err)
		}
		if rec.Calls() != 0 || m.ScopeOutcome("publish:t", dedup.OutcomeStoreError) != 1 {
			t.Fatalf("calls %d, store errors %d", rec.Calls(), m.ScopeOutcome("publish:t", dedup.OutcomeStoreError))
		}
	})
	t.Run("fail-open outage", func(t *testing.T) {
		rec := &testkit.Recorder{}
		m := &testkit.Metrics{}
		pub := decorate(t, publisher.Config{Store: &failingStore{Store: newMem(t, nil), claimErr: outage}, Policy: dedup.Policy{Metrics: m, OnStoreError: dedup.FailOpen}}, rec)
		if err := pub.Publish("t", msg("a", "")); err != nil {
			t.Fatal(err)
		}
		if len(rec.UUIDs()) != 1 || m.ScopeOutcome("publish:t", dedup.OutcomeBypassed) != 1 {
			t.Fatalf("published %d, bypassed %d: want 1 and 1", len(rec.UUIDs()), m.ScopeOutcome("publish:t", dedup.OutcomeBypassed))
		}
	})
	// refused: a fail-open publish through store fails with want and
	// publishes nothing.
	refused := func(t *testing.T, store stores.Store, want error, published string) {
		t.Helper()
		rec := &testkit.Recorder{}
		pub := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{OnStoreError: dedup.FailOpen}}, rec)
		if err := pub.Publish("t", msg("a", "")); !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
		if rec.Calls() != 0 {
			t.Fatal(published)
		}
	}
	t.Run("fail-open not an outage", func(t *testing.T) {
		refused(t, &failingStore{Store: newMem(t, nil), claimErr: errors.New("permission denied")}, dedup.ErrStore, "published unprotected on an error that is not an outage")
	})
	t.Run("complete fails", func(t *testing.T) {
		rec := &testkit.Recorder{}
		m := &testkit.Metrics{}
		base := newMem(t, nil)
		pub := decorate(t, publisher.Config{Store: &failingStore{Store: base, completeErr: errors.New("disk full")}, Policy: dedup.Policy{Metrics: m, Tuning: dedup.Tuning{CompleteTimeout: 100 * time.Millisecond}}}, rec)
		if err := pub.Publish("t", msg("a", "")); err != nil {
			t.Fatalf("the message went out, the publish must succeed: %v", err)
		}
		if m.ScopeOutcome("publish:t", dedup.OutcomeStoreError) != 1 {
			t.Fatal("the unwritten record was not counted")
		}
		// The claim is still processing: a retry within the lease waits.
		if err := pub.Publish("t", msg("a", "")); !errors.Is(err, dedup.ErrInProgress) {
			t.Fatalf("retry: %v, want ErrInProgress", err)
		}
	})
	t.Run("closed store", func(t *testing.T) {
		s := newMem(t, nil)
		_ = s.Close(context.Background())
		refused(t, s, stores.ErrClosed, "published through a closed store")
	})
	t.Run("cancelled message", func(t *testing.T) {
		rec := &testkit.Recorder{}
		m := &testkit.Metrics{}
		pub := decorate(t, publisher.Config{Store: &failingStore{Store: newMem(t, nil), claimErr: context.Canceled}, Policy: dedup.Policy{Metrics: m, OnStoreError: dedup.FailOpen}}, rec)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		mm := msg("a", "")
		mm.SetContext(ctx)
		if err := pub.Publish("t", mm); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if rec.Calls() != 0 || m.ScopeOutcome("publish:t", dedup.OutcomeCancelled) != 1 {
			t.Fatal("a cancelled message was published or not counted")
		}
	})
}

func TestValidate(t *testing.T) {
	mem := newMem(t, nil)
	for name, cfg := range map[string]publisher.Config{
		"no store":           {},
		"negative retention": {Store: mem, Policy: dedup.Policy{Retention: -1}},
		"negative lease":     {Store: mem, Policy: dedup.Policy{Lease: -1}},
		"bad mode":           {Store: mem, Mode: 7},
		"async mode":         {Store: mem, Mode: dedup.ModeAsyncComplete},
		"tx without inbox":   {Store: mem, Mode: dedup.ModeTransactional},
		"bad policy":         {Store: mem, Policy: dedup.Policy{OnStoreError: 9}},
		"negative wait":      {Store: mem, Policy: dedup.Policy{InProgressWait: -time.Second}},
		"negative poll":      {Store: mem, Policy: dedup.Policy{Tuning: dedup.Tuning{InProgressPoll: -time.Second}}},
		"negative timeout":   {Store: mem, Policy: dedup.Policy{StoreTimeout: -time.Second}},
	} {
		if _, err := publisher.New(cfg); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	d, err := publisher.New(publisher.Config{Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decorate(nil); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("Decorate(nil): %v", err)
	}
}

func TestCloseClosesDecorated(t *testing.T) {
	rec := &testkit.Recorder{}
	pub := decorate(t, publisher.Config{Store: newMem(t, nil)}, rec)
	if err := pub.Close(); err != nil || !rec.Closed() {
		t.Fatalf("Close: %v, closed %v", err, rec.Closed())
	}
}

// TestConcurrentProducers: many producers sharing one store publish the
// same events at once; each event is published once.
func TestConcurrentProducers(t *testing.T) {
	store := newMem(t, nil)
	rec := &testkit.Recorder{}
	var pubs []message.Publisher
	for range 4 {
		pubs = append(pubs, decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{InProgressWait: 5 * time.Second, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}}, rec))
	}
	var wg sync.WaitGroup
	var errs atomic.Int32
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if err := p.Publish("t", msg(fmt.Sprint("e", i), ""), msg(fmt.Sprint("e", i+1), "")); err != nil {
					t.Error(err)
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	got := rec.UUIDs()
	slices.Sort(got)
	if len(got) != 201 || len(slices.Compact(got)) != 201 {
		t.Fatalf("published %d messages, %d distinct; want 201 once each", len(rec.UUIDs()), len(slices.Compact(got)))
	}
}

// TestDuplicateInTheCallClaimsNothing: a message left out as a repeat of
// an earlier one of the same call claims none of its keys, so a later
// message sharing only its other key is published; and a repeat is
// reported as one of the first message it repeats.
func TestDuplicateInTheCallClaimsNothing(t *testing.T) {
	rec := &testkit.Recorder{}
	logger := watermill.NewCaptureLogger()
	keys := func(m *message.Message) ([]string, error) { return strings.Split(m.Metadata.Get("keys"), ","), nil }
	pub := decorate(t, publisher.Config{Store: newMem(t, nil), Key: keys, Policy: dedup.Policy{Logger: logger}}, rec)
	with := func(uuid, k string) *message.Message {
		m := msg(uuid, "")
		m.Metadata.Set("keys", k)
		return m
	}
	// m1 repeats m0 (key a) and m2 (key c); m3 shares only m1's key b.
	if err := pub.Publish("t", with("m0", "a"), with("m2", "c"), with("m1", "a,c,b"), with("m3", "b")); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.UUIDs(), []string{"m0", "m2", "m3"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	reported := false
	for _, l := range logger.Captured()[watermill.DebugLogLevel] {
		if l.Fields["message_uuid"] == "m1" {
			reported = true
			if l.Fields["duplicate_of"] != "m0" {
				t.Fatalf("m1 reported as a duplicate of %v, want m0 (the first message it repeats)", l.Fields["duplicate_of"])
			}
		}
	}
	if !reported {
		t.Fatal("m1 was not reported as left out")
	}
}

// completeOnce wraps a store: its first Complete fails with err, after
// writing the record when landed is set (the reply lost on the way back).
type completeOnce struct {
	stores.Store
	err    error
	landed bool
	failed atomic.Bool
}

func (c *completeOnce) Complete(ctx context.Context, cl *stores.Claim, retention time.Duration, data []byte) error {
	if c.failed.CompareAndSwap(false, true) {
		if c.landed {
			if err := c.Store.Complete(ctx, cl, retention, data); err != nil {
				return err
			}
		}
		return c.err
	}
	return c.Store.Complete(ctx, cl, retention, data)
}

// TestCompleteAfterPublishIsRetried: after a successful publish, a
// Complete that fails with an error the store does not classify is
// retried (as in the consumer middleware): one blip must not leave the
// record processing for a producer retry after the lease to publish the
// message again. And a Complete whose reply was lost (it landed) is
// reconciled, not reported as a record that could not be written.
func TestCompleteAfterPublishIsRetried(t *testing.T) {
	for _, landed := range []bool{false, true} {
		name := map[bool]string{false: "failed", true: "reply lost"}[landed]
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			store := &completeOnce{Store: newMem(t, clock), err: errors.New("read tcp 127.0.0.1:50000->127.0.0.1:6379: read: connection reset by peer"), landed: landed}
			logger := watermill.NewCaptureLogger()
			rec := &testkit.Recorder{}
			pub := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{Lease: time.Minute, Logger: logger}}, rec)
			if err := pub.Publish("t", msg("a", "")); err != nil {
				t.Fatal(err)
			}
			clock.Advance(2 * time.Minute) // past the lease, well inside the window
			if err := pub.Publish("t", msg("a", "")); err != nil {
				t.Fatal(err)
			}
			if n := len(rec.UUIDs()); n != 1 {
				t.Fatalf("published %d times, want 1", n)
			}
			if errs := logger.Captured()[watermill.ErrorLogLevel]; len(errs) != 0 {
				t.Errorf("logged %q, want nothing: the record was written", errs[0].Msg)
			}
		})
	}
}

// TestRouterPublisherDecorator: in a router, the consumer middleware
// re-emits a handler's stored outputs on a duplicate delivery (so an
// output whose first publish failed is not lost); with the publisher
// decorator on the router's publisher, an output that was published
// already is not published again.
func TestRouterPublisherDecorator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := newMem(t, nil)
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer ps.Close()
	outputs := &testkit.Recorder{}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	dedupMW, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Logger: logger}})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := publisher.New(publisher.Config{Store: store, Policy: dedup.Policy{Logger: logger}})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{}, 8)
	router.AddMiddleware(dedupMW.Middleware)
	// The router applies the first decorator last (outermost): one that
	// reports every publish of outputs (duplicates' re-emitted outputs
	// included) once it has returned, around the dedup decorator.
	router.AddPublisherDecorators(func(pub message.Publisher) (message.Publisher, error) {
		return signalling{pub, handled}, nil
	}, dp.Decorate)
	router.AddHandler("orders", "in", ps, "out", outputs, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	for i := range 3 { // the message and two redeliveries of it
		if err := ps.Publish("in", message.NewMessage("order-1", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatalf("delivery %d was not handled", i+1)
		}
	}
	if got := outputs.UUIDs(); len(got) != 1 || got[0] != "out-order-1" {
		t.Fatalf("outputs published %v, want [out-order-1] once", got)
	}
}

type signalling struct {
	message.Publisher
	done chan<- struct{}
}

func (s signalling) Publish(topic string, msgs ...*message.Message) error {
	err := s.Publisher.Publish(topic, msgs...)
	s.done <- struct{}{}
	return err
}

// TestCancelledWhileWaiting: a message whose context ends while it waits
// for another producer fails with the context's error.
func TestCancelledWhileWaiting(t *testing.T) {
	store := newMem(t, nil)
	c, err := store.Claim(context.Background(), "publish:t", []string{"a"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatal(c, err)
	}
	pub := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{InProgressWait: time.Minute, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}}, &testkit.Recorder{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	m := msg("a", "")
	m.SetContext(ctx)
	if err := pub.Publish("t", m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}
}
