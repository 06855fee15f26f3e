package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestRefusedCompleteAcksWithTheRecordedOutputs: our lease ran out, a
// rival took the message over, ran it and recorded its outputs; our
// Complete is refused, and the record is done. The message is acked with
// the outputs that were recorded — the ones every later duplicate
// re-emits — never with this run's own.
func TestRefusedCompleteAcksWithTheRecordedOutputs(t *testing.T) {
	clock := storetest.NewFakeClock(time.Now())
	store := newMemstoreClock(t, clock)
	cfg := middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Minute, Tuning: dedup.Tuning{Heartbeat: -1}}}
	ours, rival := testkit.DedupMiddleware(t, cfg), testkit.DedupMiddleware(t, cfg)
	out, err := ours(func(msg *message.Message) ([]*message.Message, error) {
		clock.Advance(2 * time.Minute) // this run stalls past its lease...
		// ...and a redelivery to another consumer takes it over, runs it
		// and records its outputs.
		rivalOut, err := rival(func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("rival-out", []byte("rival"))}, nil
		})(message.NewMessage(msg.UUID, nil))
		if err != nil || len(rivalOut) != 1 {
			t.Errorf("rival run: %v, %v", rivalOut, err)
		}
		return []*message.Message{message.NewMessage("our-out", []byte("ours"))}, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("err = %v, want an ack: the message is done", err)
	}
	if len(out) != 1 || out[0].UUID != "rival-out" {
		t.Fatalf("outputs = %v, want the recorded rival-out", uuids(out))
	}
}

// vanishingStore loses the record on the first Complete (as a store that
// lost its data would) and reports the claim lost; every later Complete
// fails with an outage.
type vanishingStore struct {
	stores.Store
	completes atomic.Int32
}

func (s *vanishingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if s.completes.Add(1) == 1 {
		if err := s.Store.Release(ctx, c); err != nil {
			return err
		}
		return fmt.Errorf("%w: record gone", stores.ErrLostClaim)
	}
	return fmt.Errorf("%w: store down (simulated)", stores.ErrUnavailable)
}

// TestReconcileKeepsWhatItCouldNotRecord: a refused Complete whose
// record is gone claims the keys again to record this run; when that
// Complete fails too, the message is acked (its effect happened: a nack
// would run it again) and the new claim is kept processing, so that a
// duplicate within the lease is held off instead of running again.
func TestReconcileKeepsWhatItCouldNotRecord(t *testing.T) {
	mem := newMemstore(t)
	store := &vanishingStore{Store: mem}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Hour, Logger: watermill.NopLogger{}, Tuning: dedup.Tuning{CompleteTimeout: time.Millisecond}}})
	_, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("err = %v, want an ack: the effect happened", err)
	}
	c, err := mem.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.InProgress {
		t.Fatalf("Claim after the failed reconcile = %+v, %v; want InProgress (the reconcile's claim kept)", c, err)
	}
}

func uuids(msgs []*message.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.UUID)
	}
	return out
}

// dataRefusingStore refuses every Complete that carries data with refusal.
type dataRefusingStore struct {
	stores.Store
	refusal   error
	completes atomic.Int32
}

func (s *dataRefusingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	s.completes.Add(1)
	if len(data) > 0 {
		return s.refusal
	}
	return s.Store.Complete(ctx, c, retention, data)
}

// TestCompleteRefusingTheOutputsRecordsWithoutThem: the message is never
// acked with its record still processing because the store would not keep
// its outputs, which would let a duplicate run it again once the lease ran
// out: the record is completed without them, loudly. A refusal the store
// classifies as data too large (stores.ErrTooLarge) is not retried (no
// retry changes the answer); one it does not classify is retried for
// CompleteTimeout like any failure not known to be permanent, then
// completed without the data.
func TestCompleteRefusingTheOutputsRecordsWithoutThem(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refusal error
		retried bool
	}{
		{"too large", fmt.Errorf("%w: 17 MiB, the column keeps 16 MiB", stores.ErrTooLarge), false},
		{"unclassified", errors.New("Error 1406 (22001): Data too long for column 'data' at row 1"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := storetest.NewFakeClock(time.Now())
			store := &dataRefusingStore{Store: newMemstoreClock(t, clock), refusal: tc.refusal}
			metrics := &testkit.Metrics{}
			mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: time.Minute, Tuning: dedup.Tuning{CompleteTimeout: 200 * time.Millisecond}, Metrics: metrics}})
			runs := 0
			h := mw(func(*message.Message) ([]*message.Message, error) {
				runs++
				return []*message.Message{message.NewMessage("out-1", []byte("big"))}, nil
			})
			out, err := h(message.NewMessage("m-1", nil))
			if err != nil || len(out) != 1 {
				t.Fatalf("first delivery: %v, %v; want an ack with the outputs", uuids(out), err)
			}
			if n := store.completes.Load(); tc.retried && n < 3 || !tc.retried && n != 2 {
				t.Errorf("%d Completes, want %s", n, map[bool]string{false: "2: the refused one, not retried, then one without the outputs", true: "at least 3: the refused one, retried, then one without the outputs"}[tc.retried])
			}
			clock.Advance(2 * time.Minute) // past the lease
			if _, err := h(message.NewMessage("m-1", nil)); err != nil {
				t.Fatal(err)
			}
			if runs != 1 {
				t.Fatalf("the handler ran %d times: the record was left processing", runs)
			}
			if metrics.Outcome(dedup.OutcomeStoreError) == 0 {
				t.Error("the refused Complete was not counted as a store error")
			}
		})
	}
}

// refusingStore refuses every Complete, with or without data, for a reason
// that is not an outage.
type refusingStore struct{ stores.Store }

func (refusingStore) Complete(context.Context, *stores.Claim, time.Duration, []byte) error {
	return errors.New("ERROR: permission denied for table dedup_inbox (SQLSTATE 42501)")
}

// TestCompleteRefusedWithAndWithoutOutputsIsReportedAsSuch: when even the
// Complete without outputs is refused, the record stays processing, and
// the log says so (a duplicate after the lease runs again), not that the
// message was recorded done.
func TestCompleteRefusedWithAndWithoutOutputsIsReportedAsSuch(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: refusingStore{newMemstore(t)}, Scope: "s", Policy: dedup.Policy{Logger: logger, Tuning: dedup.Tuning{CompleteTimeout: 100 * time.Millisecond}}})
	_, err := mw(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-1", nil)}, nil
	})(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("err = %v, want an ack (the effect happened)", err)
	}
	var logged []string
	for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
		logged = append(logged, m.Msg)
	}
	joined := strings.Join(logged, "\n")
	if !strings.Contains(joined, "its record stays processing") {
		t.Fatalf("error log:\n%s\nwant the record reported as left processing, not as done", joined)
	}
}

// tooLargeLostReply keeps no data above 16 bytes (it states MaxData 16),
// and loses the reply of its first Complete, which landed.
type tooLargeLostReply struct{ *replyingStore }

func (s tooLargeLostReply) Capabilities() stores.Capabilities {
	c := mayBlock(s.Store.Capabilities())
	c.MaxData = 16
	return c
}

// TestDroppedOutputsWithALostReplyAreStillReturned: outputs too large to
// keep are dropped from the record; when the reply of that Complete is
// lost, the retry finds the record done without outputs. The message is
// acked with this run's outputs, not with the none the record kept: they
// were never published.
func TestDroppedOutputsWithALostReplyAreStillReturned(t *testing.T) {
	store := tooLargeLostReply{lostReply(newMemstore(t), errConnReset)}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
	out, err := mw(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-1", make([]byte, 64))}, nil
	})(message.NewMessage("m-1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("outputs %v, err %v; want out-1 returned for publishing", uuids(out), err)
	}
	if n := store.completes.Load(); n != 2 {
		t.Fatalf("%d Completes, want 2 (the lost reply, then the retry that finds the record done)", n)
	}
}

// TestCompleteNotReplicatedIsRetried: a Complete that fails with
// redisstore.ErrNotReplicated is not permanent: the middleware retries it
// under CompleteTimeout; the retry that the replica confirms finds the
// record its first attempt wrote done, is refused, and is reconciled: the
// message is acked once, with the outputs the record holds, the handler
// ran once, and nothing is counted lost or failed.
func TestCompleteNotReplicatedIsRetried(t *testing.T) {
	// redisstore with WaitReplicas whose replica does not acknowledge the
	// first three Completes: each lands on the master (the wrapped store
	// records it) and then fails with ErrNotReplicated; so does the
	// refusal a retry meets while the replica is away (the store confirms
	// refusals too).
	store := &replyingStore{Store: newMemstore(t), reply: func(n int32, complete func() error) error {
		err := complete()
		if n <= 3 {
			return fmt.Errorf("redisstore: complete: %w: 0 of 1 replicas of 127.0.0.1:7000 acknowledged the write within 1s", errNotReplicated)
		}
		return err
	}}
	metrics := &testkit.Metrics{}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Metrics: metrics, Lease: time.Hour}})
	var runs atomic.Int32
	h := mw(func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage("out-1", []byte("points"))}, nil
	})
	out, err := h(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("a Complete not replicated three times, then confirmed: %v, want an ack", err)
	}
	if len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("outputs = %v, want out-1 (the record's)", out)
	}
	if n := store.completes.Load(); n != 4 {
		t.Fatalf("%d Complete attempts, want 4 (3 not replicated, then the confirmed refusal)", n)
	}
	for _, o := range []dedup.Outcome{dedup.OutcomeStoreError, dedup.OutcomeLostClaim} {
		if n := metrics.Outcome(o); n != 0 {
			t.Errorf("outcome %s counted %d times, want 0 (outcomes %v)", o, n, metrics.Outcomes())
		}
	}
	// The redelivery is a Duplicate with the outputs: the record was kept,
	// data and all.
	out, err = h(message.NewMessage("m-1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("redelivery = %v, %v; want the recorded out-1", out, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// cutReplyStore records every claim at once, and answers the first only
// when the test lets it, or when the caller's context ends, as a store
// over a network does: the claim is on the record whether or not the
// caller waits for the answer.
type cutReplyStore struct {
	stores.Store
	claimed chan struct{} // the first claim is on the record, its reply held
	reply   chan struct{} // closed: the reply arrives
}

// Capabilities: a store over a network, whose calls wait.
func (s *cutReplyStore) Capabilities() stores.Capabilities {
	caps := s.Store.Capabilities()
	caps.NonBlocking = false
	return caps
}

func (s *cutReplyStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c, err := s.Store.Claim(context.WithoutCancel(ctx), scope, keys, lease)
	if err != nil || c.Result != stores.Claimed {
		return c, err
	}
	select {
	case s.claimed <- struct{}{}:
	default:
		return c, nil
	}
	select {
	case <-s.reply:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestClaimCutByAClosingRouterHoldsNoKey: a message whose context ends
// while its Claim is with the store (router.Close in a deploy) is nacked
// at once, and its redelivery, to the next consumer, runs. It failed: the
// claim the store recorded held the key for the whole lease, and every
// redelivery until then was nacked as in progress (a Kafka partition
// stalled for a lease after each shutdown that caught a claim in flight;
// the acceptance suite's graceful-shutdown scenario showed it).
func TestClaimCutByAClosingRouterHoldsNoKey(t *testing.T) {
	store := &cutReplyStore{Store: newMemstore(t), claimed: make(chan struct{}, 1), reply: make(chan struct{})}
	mw, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Lease: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })

	ctx, cancel := context.WithCancel(context.Background())
	first := message.NewMessage("m1", nil)
	first.SetContext(ctx)
	go func() {
		<-store.claimed
		cancel() // the router closes while the store has the claim
	}()
	if _, err := h(first); !errors.Is(err, context.Canceled) {
		t.Fatalf("first delivery: err = %v, want the context's end", err)
	}
	if runs != 0 {
		t.Fatalf("the handler ran %d times for a delivery whose claim failed", runs)
	}
	close(store.reply) // the store's answer arrives after the nack

	// The redelivery, to the consumer that resumes the subscription: in
	// progress only until the cut claim is given back, not for the lease.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := h(message.NewMessage("m1", nil))
		if err == nil {
			break
		}
		if !errors.Is(err, dedup.ErrInProgress) || time.Now().After(deadline) {
			t.Fatalf("redelivery after the shutdown: %v (the claim the cancelled delivery left holds the key until its lease runs out)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

// TestCompleteRetriesUnclassifiedErrors: after the handler's effect, a
// Complete that fails with an error the store does not classify (a
// connection reset it did not recognise) is retried like an outage; one
// blip must not leave the record processing for a duplicate arriving
// after the lease to run again. Every mode that completes after the
// handler, with and without data on the record.
func TestCompleteRetriesUnclassifiedErrors(t *testing.T) {
	for _, mode := range []dedup.Mode{dedup.ModeLease, dedup.ModeAsyncComplete} {
		for _, withData := range []bool{false, true} {
			name := mode.String()
			if withData {
				name += "/outputs"
			}
			t.Run(name, func(t *testing.T) {
				clock := storetest.NewFakeClock(time.Unix(1_700_000_000, 0))
				inner := newMemstoreClock(t, clock)
				// The first Complete fails with an error the store does
				// not classify; every later call passes through.
				store := &replyingStore{Store: inner, reply: func(n int32, complete func() error) error {
					if n == 1 {
						return errConnReset
					}
					return complete()
				}}
				mw, err := middleware.New(middleware.Config{Store: store, Mode: mode, Policy: dedup.Policy{Lease: time.Minute, Logger: watermill.NopLogger{}}, Scope: "s"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = mw.Close(context.Background()) })
				var runs atomic.Int32
				h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					runs.Add(1)
					if withData {
						return []*message.Message{message.NewMessage("out-1", []byte("x"))}, nil
					}
					return nil, nil
				})
				if _, err := h(message.NewMessage("m-1", nil)); err != nil {
					t.Fatalf("first delivery: %v", err)
				}
				if err := mw.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				// The lease runs out; a duplicate arrives.
				clock.Advance(2 * time.Minute)
				if _, err := h(message.NewMessage("m-1", nil)); err != nil {
					t.Fatalf("duplicate: %v", err)
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times for one message whose first Complete failed once, want 1", n)
				}
			})
		}
	}
}
