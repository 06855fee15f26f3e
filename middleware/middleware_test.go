package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

const topic = "events"

func eventIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%03d", i)
	}
	return ids
}

// firstAttemptFails returns a handler whose first attempt at each event
// fails after recording nothing, and whose later attempts apply the effect.
func firstAttemptFails(l effects) message.NoPublishHandlerFunc {
	var seen sync.Map
	return func(msg *message.Message) error {
		id := string(msg.Payload)
		if _, loaded := seen.LoadOrStore(id, true); !loaded {
			return errors.New("transient failure")
		}
		l.apply(id)
		return nil
	}
}

func TestFirstAttemptFailsEveryEffectOnce(t *testing.T) {
	const n = 100
	l := newLedger()
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	h := r.AddNoPublisherHandler("loyalty", topic, ps, firstAttemptFails(l))
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t)}))
	testkit.RunRouter(t, r)

	ids := eventIDs(n)
	publishEvents(t, ps, topic, ids)
	testkit.WaitFor(t, 10*time.Second, "every event applied", func() bool { return l.distinct() == n })
	l.assertExactlyOnce(t, ids)
}

// TestBuiltinDeduplicatorLosesFailedFirstAttempts documents the bar we are
// above: Watermill's Deduplicator records the key before the handler runs
// and never releases it, so the redelivery of a failed first attempt is
// dropped as a "duplicate" and the effect never happens.
func TestBuiltinDeduplicatorLosesFailedFirstAttempts(t *testing.T) {
	const n = 100
	l := newLedger()
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	acked := atomic.Int64{}
	h := r.AddNoPublisherHandler("loyalty", topic, ps, firstAttemptFails(l))
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err == nil {
				acked.Add(1)
			}
			return out, err
		}
	})
	h.AddMiddleware((&wmw.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}).Middleware)
	testkit.RunRouter(t, r)
	for _, id := range eventIDs(n) {
		testkit.Publish(t, ps, topic, message.NewMessage(watermill.NewUUID(), []byte(id)))
	}
	testkit.WaitFor(t, 10*time.Second, "every message acked", func() bool { return acked.Load() == n })
	if got := l.distinct(); got != 0 {
		t.Fatalf("the built-in Deduplicator applied %d of %d events; this test documents that it applies none", got, n)
	}
}

func TestPanicFirstAttemptReleasedAndAppliedOnce(t *testing.T) {
	l := newLedger()
	metrics := &testkit.Metrics{}
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	var attempts atomic.Int32
	h := r.AddNoPublisherHandler("loyalty", topic, ps, func(msg *message.Message) error {
		if attempts.Add(1) == 1 {
			panic("handler bug on first attempt")
		}
		l.apply(string(msg.Payload))
		return nil
	})
	h.AddMiddleware(wmw.Recoverer)
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Policy: dedup.Policy{Metrics: metrics}}))
	testkit.RunRouter(t, r)
	testkit.Publish(t, ps, topic, message.NewMessage(watermill.NewUUID(), []byte("evt-1")))
	testkit.WaitFor(t, 10*time.Second, "the event applied", func() bool { return l.count("evt-1") == 1 })
	if got := metrics.Outcome(dedup.OutcomeReleased); got != 1 {
		t.Fatalf("released %d claims, want 1 (the panicking attempt)", got)
	}
	l.assertExactlyOnce(t, []string{"evt-1"})
}

func TestSameMessage64TimesConcurrentlyRunsOnce(t *testing.T) {
	const n = 64
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	var (
		runs       atomic.Int32
		winnerDone atomic.Bool
		started    = make(chan struct{})
		finish     = make(chan struct{})
		acked      atomic.Int32
		earlyAcks  atomic.Int32
	)
	h := r.AddNoPublisherHandler("loyalty", topic, ps, func(msg *message.Message) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-finish
		winnerDone.Store(true)
		return nil
	})
	// Outermost: watch what gets acked, and when.
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err == nil {
				if !winnerDone.Load() {
					earlyAcks.Add(1)
				}
				acked.Add(1)
			} else if !errors.Is(err, dedup.ErrInProgress) {
				t.Errorf("unexpected error: %v", err)
			}
			return out, err
		}
	})
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{
		Store: newMemstore(t),
		Policy: dedup.Policy{
			InProgressWait: 20 * time.Millisecond,
			Tuning:         dedup.Tuning{InProgressPoll: 2 * time.Millisecond},
		},
	}))
	testkit.RunRouter(t, r)

	uuid := watermill.NewUUID()
	for range n {
		testkit.Publish(t, ps, topic, message.NewMessage(uuid, []byte("evt-1")))
	}
	<-started
	// Let the 63 others collide with the running winner for a while.
	testkit.WaitFor(t, 10*time.Second, "the others retried while the winner runs", func() bool { return acked.Load() == 0 && runs.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // the window in which an early ack would show
	close(finish)
	testkit.WaitFor(t, 10*time.Second, "all 64 deliveries acked", func() bool { return acked.Load() == n })
	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times for one message delivered %d times concurrently", got, n)
	}
	if got := earlyAcks.Load(); got != 0 {
		t.Fatalf("%d deliveries were acked before the winner finished", got)
	}
}

func TestProducerRepublishUnderNewIDOneEffect(t *testing.T) {
	const n = 50
	l := newLedger()
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	h := r.AddNoPublisherHandler("loyalty", topic, ps, func(msg *message.Message) error {
		l.apply(string(msg.Metadata.Get("payment")))
		return nil
	})
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{
		Store: newMemstore(t),
		Key: keyfuncs.All(
			keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
			keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
		),
	}))
	testkit.RunRouter(t, r)
	var ids []string
	for i := range n {
		pay := fmt.Sprintf("PAY-%d", i)
		ids = append(ids, pay)
		for range 2 { // the producer retries under a new message id
			m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"payment_id":%q,"amount":10}`, pay))
			m.Metadata.Set("payment", pay)
			testkit.Publish(t, ps, topic, m)
		}
	}
	testkit.WaitFor(t, 10*time.Second, "every payment applied", func() bool { return l.distinct() == n })
	time.Sleep(50 * time.Millisecond) // let any second effect land before asserting
	l.assertExactlyOnce(t, ids)
}

// failFirstPublish fails the first Publish of each message UUID.
type failFirstPublish struct {
	message.Publisher
	seen sync.Map
}

func (p *failFirstPublish) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, loaded := p.seen.LoadOrStore(m.UUID, true); !loaded {
			return fmt.Errorf("publish of %s failed (simulated)", m.UUID)
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

func TestOutputsSurviveFailedPublish(t *testing.T) {
	const n = 20
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	var runs atomic.Int32
	r.AddHandler("loyalty", topic, ps, "points", &failFirstPublish{Publisher: ps}, func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		out := message.NewMessage(watermill.NewUUID(), append([]byte("points-for-"), msg.Payload...))
		out.Metadata.Set("source", msg.UUID)
		return []*message.Message{out}, nil
	}).AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t)}))

	// Downstream: count the outputs by UUID and by source.
	var mu sync.Mutex
	byUUID := map[string]int{}
	bySource := map[string]map[string]bool{}
	sub, err := ps.Subscribe(context.Background(), "points")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range sub {
			mu.Lock()
			byUUID[m.UUID]++
			src := m.Metadata.Get("source")
			if bySource[src] == nil {
				bySource[src] = map[string]bool{}
			}
			bySource[src][m.UUID] = true
			mu.Unlock()
			m.Ack()
		}
	}()
	testkit.RunRouter(t, r)
	for _, id := range eventIDs(n) {
		testkit.Publish(t, ps, topic, message.NewMessage(watermill.NewUUID(), []byte(id)))
	}
	testkit.WaitFor(t, 10*time.Second, "an output per event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bySource) == n
	})
	if got := runs.Load(); got != n {
		t.Fatalf("handler ran %d times for %d events; a failed publish must not rerun it", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	for src, uuids := range bySource {
		if len(uuids) != 1 {
			t.Errorf("event %s produced %d distinct outputs, want 1 re-emitted with a stable UUID", src, len(uuids))
		}
	}
}

func TestMissingKeyIsPoisonStoreUntouched(t *testing.T) {
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	store := &flakyStore{Store: newMemstore(t)}
	l := newLedger()
	poison, err := wmw.PoisonQueueWithFilter(ps, "poison", dedup.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	var keyErr atomic.Value
	h := r.AddNoPublisherHandler("loyalty", topic, ps, func(msg *message.Message) error {
		l.apply(msg.UUID)
		return nil
	})
	h.AddMiddleware(poison)
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err != nil {
				keyErr.Store(err)
			}
			return out, err
		}
	})
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: store, Key: keyfuncs.JSON("payment_id")}))
	poisoned, err := ps.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	testkit.RunRouter(t, r)

	bad := message.NewMessage("bad-1", []byte(`{"amount":1}`))
	testkit.Publish(t, ps, topic, bad)
	select {
	case p := <-poisoned:
		p.Ack()
		if p.UUID != "bad-1" {
			t.Fatalf("poisoned %s, want bad-1", p.UUID)
		}
		if !strings.Contains(p.Metadata.Get(wmw.ReasonForPoisonedKey), `"payment_id" is missing`) {
			t.Fatalf("poison reason %q does not say what was missing", p.Metadata.Get(wmw.ReasonForPoisonedKey))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the unkeyable message did not reach the poison queue")
	}
	if err, _ := keyErr.Load().(error); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("middleware error %v does not wrap keyfuncs.ErrNoKey", err)
	}
	if n := store.calls.Load(); n != 0 {
		t.Fatalf("the store was called %d times for an unkeyable message", n)
	}
	// The stream continues.
	testkit.Publish(t, ps, topic, message.NewMessage("good-1", []byte(`{"payment_id":"P1"}`)))
	testkit.WaitFor(t, 10*time.Second, "the next message applied", func() bool { return l.count("good-1") == 1 })
	if l.count("bad-1") != 0 {
		t.Fatal("the unkeyable message ran the handler")
	}
}

// storeDown is a router on a pub/sub of its own whose handler applies
// each payload to a ledger, with metrics, and a flakyStore that is down.
type storeDown struct {
	l       effects
	metrics *testkit.Metrics
	store   *flakyStore
	ps      *gochannel.GoChannel
	r       *message.Router
	h       *message.Handler
}

func newStoreDown(t *testing.T) *storeDown {
	d := &storeDown{l: newLedger(), metrics: &testkit.Metrics{}, store: &flakyStore{Store: newMemstore(t)}, ps: testkit.NewPubSub(t), r: testkit.NewRouter(t)}
	d.store.down.Store(true)
	d.h = d.r.AddNoPublisherHandler("loyalty", topic, d.ps, func(msg *message.Message) error {
		d.l.apply(string(msg.Payload))
		return nil
	})
	return d
}

func TestStoreDownFailClosed(t *testing.T) {
	const n = 30
	d := newStoreDown(t)
	l, metrics, store, ps, r, h := d.l, d.metrics, d.store, d.ps, d.r, d.h
	var nacks atomic.Int64
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err != nil {
				if !errors.Is(err, dedup.ErrStore) || !errors.Is(err, errDown) {
					t.Errorf("fail-closed error %v should wrap ErrStore and the store's error", err)
				}
				nacks.Add(1)
				time.Sleep(time.Millisecond) // a broker's redelivery delay
			}
			return out, err
		}
	})
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: store, Policy: dedup.Policy{Metrics: metrics}}))
	testkit.RunRouter(t, r)
	ids := eventIDs(n)
	publishEvents(t, ps, topic, ids)
	testkit.WaitFor(t, 10*time.Second, "every message nacked at least twice while down", func() bool { return nacks.Load() >= 2*n })
	if got := l.distinct(); got != 0 {
		t.Fatalf("fail-closed ran the handler %d times while the store was down", got)
	}
	store.down.Store(false)
	testkit.WaitFor(t, 10*time.Second, "every event applied after the store returned", func() bool { return l.distinct() == n })
	l.assertExactlyOnce(t, ids)
	if metrics.Outcome(dedup.OutcomeStoreError) == 0 || metrics.Outcome(dedup.OutcomeBypassed) != 0 {
		t.Fatalf("metrics: %d store errors, %d bypasses; want some and none", metrics.Outcome(dedup.OutcomeStoreError), metrics.Outcome(dedup.OutcomeBypassed))
	}
}

func TestStoreDownFailOpen(t *testing.T) {
	const n = 10
	d := newStoreDown(t)
	l, metrics, store, ps, r, h := d.l, d.metrics, d.store, d.ps, d.r, d.h
	h.AddMiddleware(testkit.DedupMiddleware(t, middleware.Config{Store: store, Policy: dedup.Policy{Metrics: metrics, OnStoreError: dedup.FailOpen}}))
	testkit.RunRouter(t, r)
	ids := eventIDs(n)
	publishEvents(t, ps, topic, ids)
	testkit.WaitFor(t, 10*time.Second, "every event applied unprotected", func() bool { return l.distinct() == n })
	l.assertExactlyOnce(t, ids)
	if got := metrics.Outcome(dedup.OutcomeBypassed); got != n {
		t.Fatalf("%d bypasses counted, want %d", got, n)
	}
}

func TestHeartbeatKeepsLongHandlerClaimed(t *testing.T) {
	ctx := context.Background()
	// The store's time is the test's: the lease runs out only when the
	// handler moves the clock, half a lease at a time, each time once the
	// heartbeat has extended the lease since the last move (however late
	// it came).
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	metrics := &testkit.Metrics{}
	extends := func() int { return metrics.Calls(dedup.OpExtend) }
	lease := 150 * time.Millisecond
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: lease, Tuning: dedup.Tuning{Heartbeat: lease / 5}, Metrics: metrics}})
	var (
		rivals  []stores.Result
		handler = func(msg *message.Message) ([]*message.Message, error) {
			// Run for 4 leases, checking that nobody can take the message.
			for range 8 {
				// An Extend that read the clock after the last move is the
				// second to land since (a claim has one Extend in flight
				// at a time: the first may have begun before the move).
				n := extends()
				testkit.WaitFor(t, time.Minute, "the heartbeat to extend the lease", func() bool { return extends() >= n+2 })
				clock.Advance(lease / 2)
				c, err := store.Claim(ctx, "s", []string{msg.UUID}, lease)
				if err != nil {
					return nil, err
				}
				rivals = append(rivals, c.Result)
			}
			return nil, msg.Context().Err()
		}
	)
	if _, err := mw(handler)(message.NewMessage("long-1", nil)); err != nil {
		t.Fatalf("long handler: %v", err)
	}
	for i, r := range rivals {
		if r != stores.InProgress {
			t.Fatalf("rival claim %d at %s = %s, want in_progress: the running handler lost its claim", i, time.Duration(i+1)*lease/2, r)
		}
	}
	c, err := store.Claim(ctx, "s", []string{"long-1"}, lease)
	if err != nil || c.Result != stores.Duplicate {
		t.Fatalf("after the handler: %v %v, want duplicate", c.Result, err)
	}
}

func TestLostClaimCancelsHandlerAndNacks(t *testing.T) {
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	metrics := &testkit.Metrics{}
	lease := time.Second
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: lease, Tuning: dedup.Tuning{Heartbeat: 20 * time.Millisecond}, Metrics: metrics}})
	var handlerCtxErr error
	_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
		// The lease runs out (as if this process stalled) and a rival takes over.
		clock.Advance(2 * lease)
		c, err := store.Claim(context.Background(), "s", []string{msg.UUID}, lease)
		if err != nil || c.Result != stores.Claimed || !c.Takeover {
			t.Errorf("rival takeover: %+v %v", c, err)
		}
		select {
		case <-msg.Context().Done():
			handlerCtxErr = context.Cause(msg.Context())
		case <-time.After(time.Minute): // a watchdog: the next heartbeat ends it
		}
		return nil, nil
	})(message.NewMessage("m-1", nil))
	if !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("error = %v, want one wrapping stores.ErrLostClaim (nack)", err)
	}
	if !errors.Is(handlerCtxErr, stores.ErrLostClaim) {
		t.Fatalf("handler context cause = %v, want ErrLostClaim", handlerCtxErr)
	}
	if metrics.Outcome(dedup.OutcomeLostClaim) == 0 {
		t.Fatal("lost claim not counted")
	}
}

func TestInProgressReturnsRetryableError(t *testing.T) {
	store := newMemstore(t)
	c, err := store.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s"})
	ran := false
	_, err = mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(message.NewMessage("m-1", nil))
	if !errors.Is(err, dedup.ErrInProgress) || ran {
		t.Fatalf("err = %v, ran = %v; want ErrInProgress without running", err, ran)
	}
	// With a wait, a delivery that collides with a run that then completes
	// is acked as a duplicate. The run completes once the delivery found
	// it in progress and polls (its second claim), however long that took.
	counter := &claimCounter{Store: store}
	mw = testkit.DedupMiddleware(t, middleware.Config{Store: counter, Scope: "s", Policy: dedup.Policy{InProgressWait: time.Minute, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}})
	go func() {
		for counter.count() < 2 {
			time.Sleep(time.Millisecond)
		}
		_ = store.Complete(context.Background(), c, time.Hour, nil)
	}()
	_, err = mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(message.NewMessage("m-1", nil))
	if err != nil || ran {
		t.Fatalf("after waiting: err = %v, ran = %v; want a duplicate ack", err, ran)
	}
}

func TestFingerprintMismatch(t *testing.T) {
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Key: keyfuncs.JSON("id"), Fingerprint: middleware.PayloadFingerprint})
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	if _, err := mw(h)(message.NewMessage("1", []byte(`{"id":"A","amount":1}`))); err != nil {
		t.Fatal(err)
	}
	if _, err := mw(h)(message.NewMessage("2", []byte(`{"id":"A","amount":1}`))); err != nil {
		t.Fatalf("same key, same payload: %v, want a duplicate ack", err)
	}
	_, err := mw(h)(message.NewMessage("3", []byte(`{"id":"A","amount":999}`)))
	if !errors.Is(err, dedup.ErrFingerprintMismatch) || !dedup.IsPermanent(err) {
		t.Fatalf("same key, different payload: %v, want ErrFingerprintMismatch", err)
	}
}

func TestTTLMissCounted(t *testing.T) {
	metrics := &testkit.Metrics{}
	logger := watermill.NewCaptureLogger()
	mw := testkit.DedupMiddleware(t, middleware.Config{
		Store: newMemstore(t), Policy: dedup.Policy{Retention: time.Hour, Metrics: metrics, Logger: logger}, PublishedAt: middleware.MetadataTime("published_at"),
	})
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	old := message.NewMessage("old", nil)
	old.Metadata.Set("published_at", time.Now().Add(-2*time.Hour).Format(time.RFC3339Nano))
	fresh := message.NewMessage("fresh", nil)
	fresh.Metadata.Set("published_at", time.Now().Format(time.RFC3339Nano))
	recent := message.NewMessage("recent", nil)
	recent.Metadata.Set("published_at", time.Now().Add(-30*time.Minute).Format(time.RFC3339Nano))
	for _, m := range []*message.Message{old, fresh, recent, message.NewMessage("unknown", nil)} {
		if _, err := mw(h)(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := metrics.Outcome(dedup.OutcomeTTLMiss); got != 1 {
		t.Fatalf("%d ttl misses, want 1", got)
	}
	// Logged at error level with an error that says what happened (a nil
	// error printed "error=<nil>").
	logged := logger.Captured()[watermill.ErrorLogLevel]
	if len(logged) != 1 || logged[0].Err == nil || !strings.Contains(logged[0].Err.Error(), "retention") {
		t.Fatalf("ttl miss logged as %+v, want one error-level line with an error naming the retention", logged)
	}
}

func TestConfigValidate(t *testing.T) {
	s := newMemstore(t)
	cases := map[string]middleware.Config{
		"no store":                  {},
		"negative lease":            {Store: s, Policy: dedup.Policy{Lease: -1}},
		"negative retention":        {Store: s, Policy: dedup.Policy{Retention: -1}},
		"heartbeat >= lease":        {Store: s, Policy: dedup.Policy{Lease: time.Second, Tuning: dedup.Tuning{Heartbeat: time.Second}}},
		"transactional memstore":    {Store: s, Mode: dedup.ModeTransactional},
		"unknown mode":              {Store: s, Mode: dedup.ModeTransactional + 1},
		"negative complete timeout": {Store: s, Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: -1}}},
		"negative poll":             {Store: s, Policy: dedup.Policy{Tuning: dedup.Tuning{InProgressPoll: -1}}},
		"complete linger >= lease":  {Store: s, Policy: dedup.Policy{Lease: time.Second, Tuning: dedup.Tuning{CompleteLinger: time.Second}}},
		"linger >= store timeout":   {Store: s, Policy: dedup.Policy{StoreTimeout: time.Second, Tuning: dedup.Tuning{CompleteLinger: time.Second}}},
		"unknown store err policy":  {Store: s, Policy: dedup.Policy{OnStoreError: 7}},
	}
	for name, cfg := range cases {
		if _, err := middleware.New(cfg); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := (middleware.Config{Store: s}).Validate(); err != nil {
		t.Fatalf("a config with only a Store: %v", err)
	}
}

func TestScopeDefaultsToHandlerName(t *testing.T) {
	store := newMemstore(t)
	ps := testkit.NewPubSub(t)
	r := testkit.NewRouter(t)
	l := newLedger()
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store})
	for _, name := range []string{"loyalty", "analytics"} {
		r.AddNoPublisherHandler(name, topic, ps, func(msg *message.Message) error {
			l.apply(name)
			return nil
		}).AddMiddleware(mw)
	}
	testkit.RunRouter(t, r)
	testkit.Publish(t, ps, topic, message.NewMessage("m-1", nil))
	testkit.WaitFor(t, 10*time.Second, "both handlers ran", func() bool { return l.count("loyalty") == 1 && l.count("analytics") == 1 })
	for _, scope := range []string{"loyalty", "analytics"} {
		c, err := store.Claim(context.Background(), scope, []string{"m-1"}, time.Minute)
		if err != nil || c.Result != stores.Duplicate {
			t.Fatalf("scope %s: %v %v, want duplicate", scope, c.Result, err)
		}
	}
	// Outside a router there is no handler name.
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-2", nil)); err != nil {
		t.Fatal(err)
	}
	c, _ := store.Claim(context.Background(), middleware.DefaultScope, []string{"m-2"}, time.Minute)
	if c.Result != stores.Duplicate {
		t.Fatalf("outside a router the scope is not %q", middleware.DefaultScope)
	}
}

func TestHandlerSeesClaim(t *testing.T) {
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s"})
	_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
		c, ok := middleware.ClaimFromContext(msg.Context())
		if !ok || c.Token == "" || c.Keys[0] != "m-1" {
			return nil, fmt.Errorf("claim in context: %+v %v", c, ok)
		}
		return nil, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatal(err)
	}
}

func TestCompleteWhoseReplyWasLostAcksWithRecordedOutputs(t *testing.T) {
	// The first Complete lands but reports a timeout.
	store := lostReply(newMemstore(t), context.DeadlineExceeded)
	metrics := &testkit.Metrics{}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Metrics: metrics}})
	out, err := mw(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-1", []byte("points"))}, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("a Complete applied on its first try must not nack: %v", err)
	}
	if len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("outputs = %v, want the recorded out-1", out)
	}
	if metrics.Outcome(dedup.OutcomeLostClaim) != 0 {
		t.Fatal("an own retried Complete was counted as a lost claim")
	}
}

// completeFailures is a flakyStore that reports each Complete it fails
// while down to onFail, with the number failed so far: a test ends an
// outage (or does anything else) after so many failed attempts, not
// after a timer that a slow machine may outrun.
type completeFailures struct {
	*flakyStore
	failed atomic.Int32
	onFail func(n int32)
}

func (s *completeFailures) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	err := s.flakyStore.Complete(ctx, c, retention, data)
	if errors.Is(err, errDown) {
		s.onFail(s.failed.Add(1))
	}
	return err
}

func TestStoreOutageDuringCompleteIsRidden(t *testing.T) {
	// The outage lasts two failed Completes, however long they take; the
	// retries (for CompleteTimeout, the lease) outlast it.
	store := &completeFailures{flakyStore: &flakyStore{Store: newMemstore(t)}}
	store.onFail = func(n int32) {
		if n == 2 {
			store.down.Store(false)
		}
	}
	l := newLedger()
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Hour}})
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		l.apply(msg.UUID)
		store.down.Store(true) // the store goes away right after the effect
		return nil, nil
	})
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	if n := store.failed.Load(); n != 2 {
		t.Fatalf("%d Completes failed in the outage, want 2", n)
	}
	// The redelivery is a duplicate: Complete went through after the outage.
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	l.assertExactlyOnce(t, []string{"m-1"})
}

// keyRejectingStore rejects every key, as a store with a key-length bound
// does for an over-long key.
type keyRejectingStore struct{ stores.Store }

func (keyRejectingStore) Claim(context.Context, string, []string, time.Duration) (*stores.Claim, error) {
	return nil, fmt.Errorf("%w: key too long", stores.ErrInvalidKey)
}

func TestKeyRejectedByStoreIsBadInputNotStoreError(t *testing.T) {
	metrics := &testkit.Metrics{}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: keyRejectingStore{newMemstore(t)}, Policy: dedup.Policy{Metrics: metrics, OnStoreError: dedup.FailOpen}})
	ran := false
	_, err := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(message.NewMessage("m-1", nil))
	if !errors.Is(err, keyfuncs.ErrNoKey) || !dedup.IsPermanent(err) || ran {
		t.Fatalf("err = %v, ran = %v; want a permanent ErrNoKey without running (even fail-open)", err, ran)
	}
	if metrics.Outcome(dedup.OutcomeStoreError) != 0 || metrics.Outcome(dedup.OutcomeNoKey) != 1 {
		t.Fatalf("outcomes: %d store errors, %d no_key; want 0 and 1", metrics.Outcome(dedup.OutcomeStoreError), metrics.Outcome(dedup.OutcomeNoKey))
	}
}

// A Fingerprint that panics after a successful handler releases the
// claim, as a panicking handler does: the redelivery can run.
func TestPanickingFingerprintReleasesTheClaim(t *testing.T) {
	store := newMemstore(t)
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{Heartbeat: 20 * time.Millisecond}}, Fingerprint: func(*message.Message) []byte { panic("fingerprint bug") }})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the Fingerprint's panic did not reach the caller")
			}
		}()
		_, _ = mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil))
	}()
	c, err := store.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("claim after the panic: %+v, %v; want the record released", c, err)
	}
}

// A goroutine the handler leaves behind sees its context end when the
// handler returns, even if the handler never asked for Done.
func TestHandlerContextEndsWhenTheHandlerReturns(t *testing.T) {
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s"})
	var hctx context.Context
	if _, err := mw(func(msg *message.Message) ([]*message.Message, error) {
		hctx = msg.Context()
		if err := hctx.Err(); err != nil {
			t.Errorf("handler context ended while the handler ran: %v", err)
		}
		return nil, nil
	})(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(hctx.Err(), context.Canceled) {
		t.Fatalf("handler context after the handler returned: Err = %v, want context.Canceled", hctx.Err())
	}
	select {
	case <-hctx.Done():
	default:
		t.Fatal("handler context after the handler returned: Done not closed")
	}
}

// slowReplyStore applies a Complete, then loses its reply, as a Complete
// whose reply is slow on the network and times out, until an Extend has
// run on the store after the Complete applied: a heartbeat that fired
// between the Complete's retries and found the record done.
type slowReplyStore struct {
	stores.Store
	applied  atomic.Bool
	extended atomic.Bool // an Extend ran after a Complete applied
}

func newSlowReplyStore(s stores.Store) *slowReplyStore { return &slowReplyStore{Store: s} }

// Capabilities are the wrapped store's, but it may block (a store that
// never blocks gets no per-call timeouts).
func (s *slowReplyStore) Capabilities() stores.Capabilities { return mayBlock(s.Store.Capabilities()) }

func (s *slowReplyStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	err := s.Store.Complete(ctx, c, retention, data)
	s.applied.Store(true)
	if !s.extended.Load() {
		return fmt.Errorf("complete: %w (the reply timed out)", context.DeadlineExceeded)
	}
	return err
}

func (s *slowReplyStore) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	err := s.Store.Extend(ctx, c, lease)
	if s.applied.Load() {
		s.extended.Store(true)
	}
	return err
}

// A heartbeat that fires between the retries of a Complete whose reply
// was lost finds the record done: that is not a lost lease, and the
// message is acked.
func TestHeartbeatDuringCompleteIsNotALostClaim(t *testing.T) {
	for _, mode := range []dedup.Mode{dedup.ModeLease, dedup.ModeAsyncComplete} {
		async := mode == dedup.ModeAsyncComplete
		metrics := &testkit.Metrics{}
		cfg := middleware.Config{Store: newSlowReplyStore(newMemstore(t)), Scope: "s",
			Policy: dedup.Policy{Lease: time.Minute, StoreTimeout: time.Minute, Tuning: dedup.Tuning{Heartbeat: 10 * time.Millisecond}, Metrics: metrics}, Mode: mode}
		m, err := middleware.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil)); err != nil {
			t.Fatalf("async=%v: %v", async, err)
		}
		if err := m.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := metrics.Outcome(dedup.OutcomeLostClaim); n != 0 {
			t.Errorf("async=%v: %d lost-claim outcomes for a message that completed", async, n)
		}
		extends := metrics.Calls(dedup.OpExtend)
		if extends == 0 {
			t.Errorf("async=%v: no Extend ran during the Complete's retries: the test proved nothing", async)
		}
	}
}

// TestPermanentFailuresAreLoggedAndCounted: a message the middleware fails
// for good — no key, a key reused for other content, a record it cannot
// decode — is logged at error level by the configured logger and counted,
// whatever the router then does with the error. Nothing is dropped
// silently.
func TestPermanentFailuresAreLoggedAndCounted(t *testing.T) {
	store := newMemstore(t)
	// A done record whose data is not the middleware's encoding.
	c, err := store.Claim(context.Background(), "s", []string{"corrupt"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(context.Background(), c, time.Hour, []byte{9, 9, 9}); err != nil {
		t.Fatal(err)
	}
	logger := watermill.NewCaptureLogger()
	metrics := &testkit.Metrics{}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Key: keyfuncs.JSON("id"),
		Fingerprint: middleware.PayloadFingerprint, Policy: dedup.Policy{Logger: logger, Metrics: metrics}})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	if _, err := mw(ok)(message.NewMessage("m-0", []byte(`{"id":"a","v":1}`))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		payload string
		outcome dedup.Outcome
		err     error
	}{
		{`{"v":1}`, dedup.OutcomeNoKey, keyfuncs.ErrNoKey},
		{`{"id":"a","v":2}`, dedup.OutcomeFingerprintMismatch, dedup.ErrFingerprintMismatch},
		{`{"id":"corrupt"}`, dedup.OutcomeCorruptRecord, dedup.ErrCorruptRecord},
	} {
		_, err := mw(ok)(message.NewMessage("m-"+tc.outcome.String(), []byte(tc.payload)))
		if !errors.Is(err, tc.err) || !dedup.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error wrapping %v", tc.outcome, err, tc.err)
		}
		logged := false
		for _, l := range logger.Captured()[watermill.ErrorLogLevel] {
			logged = logged || errors.Is(l.Err, tc.err)
		}
		if !logged {
			t.Errorf("%s: not logged at error level", tc.outcome)
		}
		if n := metrics.Outcome(tc.outcome); n != 1 {
			t.Errorf("%s counted %d times, want 1", tc.outcome, n)
		}
	}
}

// TestDefaultLoggerIsNotSilent: without Config.Logger the middleware logs
// through log/slog's default logger, so a permanent failure is visible in
// a program that configured nothing.
func TestDefaultLoggerIsNotSilent(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Key: keyfuncs.JSON("id")})
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", []byte(`{}`))); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "m-1") {
		t.Fatalf("nothing logged through slog.Default(): %q", buf.String())
	}
}

// TestDefaultLoggerFollowsSetDefault: the default logger is log/slog's
// default at the time of each log line, not at New: a program that sets
// its slog handler after building the middleware still sees its errors at
// error level.
func TestDefaultLoggerFollowsSetDefault(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Key: keyfuncs.JSON("id")})
	var buf bytes.Buffer
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", []byte(`{}`))); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"level":"ERROR"`) || !strings.Contains(buf.String(), `"outcome":"no_key"`) {
		t.Fatalf("the handler set after New got %q, want the no-key error at ERROR with its fields", buf.String())
	}
}

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
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: 10 * time.Second, Tuning: dedup.Tuning{Heartbeat: 10 * time.Millisecond}, StoreTimeout: storeTimeout}})
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
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: lease, Metrics: metrics}})
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
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{InProgressWait: 10 * time.Second}})
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
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: newMemstore(t), Scope: "s", Policy: dedup.Policy{Lease: lease, Metrics: metrics}})
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
