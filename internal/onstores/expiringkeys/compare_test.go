package expiringkeys_test

// What the Deduplicator gives up against the dedup middleware and the
// publisher decorator, shown on every store: each test runs the same
// deliveries through Watermill's Deduplicator on a Repository and through
// this module's middleware (or publisher) on the same store. The README's
// table ("Already on Watermill's Deduplicator?") states these results.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
)

var errTransient = errors.New("transient failure")

// both returns h behind Watermill's Deduplicator on a Repository of
// store, and behind the dedup middleware on store, each in a scope of
// its own. Both key a message by its payload's SHA-256.
func both(t *testing.T, store stores.Store, h func(deduplicator bool) message.HandlerFunc) (deduplicator, ours message.HandlerFunc) {
	t.Helper()
	d := &wmw.Deduplicator{
		KeyFactory: wmw.NewMessageHasherSHA256(math.MaxInt64),
		Repository: newRepo(t, store, expiringkeys.Config{Scope: "deduplicator"}),
		Timeout:    time.Minute,
	}
	mw, err := middleware.New(middleware.Config{
		Store: store, Scope: "middleware", Key: keyfuncs.PayloadSHA256(),
		Policy: dedup.Policy{Logger: watermill.NopLogger{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Close(context.Background()) })
	return d.Middleware(h(true)), mw.Middleware(h(false))
}

// deliver calls h with a copy of msg (a redelivery: the same UUID,
// payload and metadata, a new ack) and returns its result.
func deliver(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	return h(msg.Copy())
}

// A handler whose first attempt fails: the Deduplicator drops the
// redelivery as a duplicate, and the effect never happens; the
// middleware released the claim, so the redelivery runs it, once.
func TestFailedFirstAttemptIsLostByTheDeduplicator(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, _ stores.Store) {
		var attempts, applied [2]atomic.Int32 // [0] the Deduplicator's, [1] the middleware's
		deduplicator, ours := both(t, store, func(d bool) message.HandlerFunc {
			i := 1
			if d {
				i = 0
			}
			return func(*message.Message) ([]*message.Message, error) {
				if attempts[i].Add(1) == 1 {
					return nil, errTransient
				}
				applied[i].Add(1)
				return nil, nil
			}
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"PAY-1842"}`))
		for i, h := range []message.HandlerFunc{deduplicator, ours} {
			if _, err := deliver(h, msg); !errors.Is(err, errTransient) {
				t.Fatalf("handler %d: the first attempt returned %v, want the handler's error (a nack)", i, err)
			}
			for range 2 { // the redelivery, then a duplicate
				if _, err := deliver(h, msg); err != nil {
					t.Fatalf("handler %d: %v", i, err)
				}
			}
		}
		if a, n := attempts[0].Load(), applied[0].Load(); a != 1 || n != 0 {
			t.Errorf("the Deduplicator ran the handler %d times and applied the effect %d times; want 1 and 0 (the redelivery dropped)", a, n)
		}
		if a, n := attempts[1].Load(), applied[1].Load(); a != 2 || n != 1 {
			t.Errorf("the middleware ran the handler %d times and applied the effect %d times; want 2 and 1", a, n)
		}
	})
}

// A duplicate delivered while the first delivery's handler runs: the
// Deduplicator acks it at once, so when the first attempt then fails the
// message is lost; the middleware nacks it (dedup.ErrInProgress) and the
// failed first attempt's redelivery runs.
func TestDuplicateWhileTheFirstRuns(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, _ stores.Store) {
		var applied [2]atomic.Int32
		started, fail := make(chan struct{}, 1), make(chan struct{})
		deduplicator, ours := both(t, store, func(d bool) message.HandlerFunc {
			i := 1
			if d {
				i = 0
			}
			var attempts atomic.Int32
			return func(*message.Message) ([]*message.Message, error) {
				if attempts.Add(1) == 1 {
					started <- struct{}{}
					<-fail
					return nil, errTransient
				}
				applied[i].Add(1)
				return nil, nil
			}
		})
		defer close(fail)
		for i, h := range []message.HandlerFunc{deduplicator, ours} {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "event %d", i))
			first := make(chan error, 1)
			go func() {
				_, err := deliver(h, msg)
				first <- err
			}()
			<-started
			_, err := deliver(h, msg) // the duplicate, while the first runs
			switch {
			case i == 0 && err != nil:
				t.Errorf("the Deduplicator returned %v for the duplicate, want nil (acked)", err)
			case i == 1 && !errors.Is(err, dedup.ErrInProgress):
				t.Errorf("the middleware returned %v for the duplicate, want dedup.ErrInProgress (nacked)", err)
			}
			fail <- struct{}{}
			if err := <-first; !errors.Is(err, errTransient) {
				t.Fatalf("handler %d: the first attempt returned %v", i, err)
			}
			if _, err := deliver(h, msg); err != nil { // the failed attempt's redelivery
				t.Fatalf("handler %d: the redelivery: %v", i, err)
			}
		}
		if n := applied[0].Load(); n != 0 {
			t.Errorf("the Deduplicator applied the effect %d times, want 0", n)
		}
		if n := applied[1].Load(); n != 1 {
			t.Errorf("the middleware applied the effect %d times, want 1", n)
		}
	})
}

// A handler's produced messages whose publish failed (the router nacks
// the message): the Deduplicator's redelivery returns none, so they are
// lost; the middleware returns the same messages (same UUIDs) again.
func TestOutputsOfAFailedPublishAreLostByTheDeduplicator(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, _ stores.Store) {
		deduplicator, ours := both(t, store, func(bool) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("points awarded"))}, nil
			}
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"PAY-1842"}`))
		for i, h := range []message.HandlerFunc{deduplicator, ours} {
			out, err := deliver(h, msg)
			if err != nil || len(out) != 1 {
				t.Fatalf("handler %d: the first delivery returned %d messages, %v", i, len(out), err)
			}
			// The router fails to publish out and nacks the message.
			again, err := deliver(h, msg)
			if err != nil {
				t.Fatalf("handler %d: the redelivery: %v", i, err)
			}
			switch {
			case i == 0 && len(again) != 0:
				t.Errorf("the Deduplicator's redelivery returned %d messages, want none (the outputs are lost)", len(again))
			case i == 1 && (len(again) != 1 || again[0].UUID != out[0].UUID):
				t.Errorf("the middleware's redelivery returned %v, want the first delivery's output %s again", again, out[0].UUID)
			}
		}
	})
}

// A publish that fails after the Deduplicator's PublisherDecorator
// marked the message: the producer's retry is acked and dropped, and the
// message never reaches the topic; the dedup publisher released its
// claim, so the retry publishes it, once.
func TestFailedPublishIsLostByTheDecorator(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, _ stores.Store) {
		d := &wmw.Deduplicator{
			KeyFactory: wmw.NewMessageHasherSHA256(math.MaxInt64),
			Repository: newRepo(t, store, expiringkeys.Config{Scope: "deduplicator"}),
			Timeout:    time.Minute,
		}
		ours, err := publisher.New(publisher.Config{Store: store, Scope: "publisher", Key: keyfuncs.PayloadSHA256(),
			Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
		if err != nil {
			t.Fatal(err)
		}
		for i, decorate := range []message.PublisherDecorator{d.PublisherDecorator(), ours.Decorate} {
			inner := &testkit.Recorder{FailNext: 1, Err: errTransient}
			pub, err := decorate(inner)
			if err != nil {
				t.Fatal(err)
			}
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
			if err := pub.Publish("orders", msg); !errors.Is(err, errTransient) {
				t.Fatalf("publisher %d: the first Publish returned %v, want the broker's error", i, err)
			}
			for range 2 { // the producer's retry, then a duplicate
				if err := pub.Publish("orders", msg.Copy()); err != nil {
					t.Fatalf("publisher %d: %v", i, err)
				}
			}
			got := len(inner.UUIDs())
			switch {
			case i == 0 && got != 0:
				t.Errorf("the Deduplicator's decorator published %d messages, want none (the retry dropped)", got)
			case i == 1 && got != 1:
				t.Errorf("the dedup publisher published %d messages, want 1", got)
			}
		}
	})
}

// A consumer that dies while its handler runs: the Deduplicator marked
// the key before the handler, so the redelivery, on another consumer, is
// dropped; the middleware's claim is a lease, which the redelivery takes
// over once it runs out, and runs the handler.
func TestConsumerDeathMidHandler(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		var runs [2]atomic.Int32
		deduplicator, ours := both(t, store, func(d bool) message.HandlerFunc {
			i := 1
			if d {
				i = 0
			}
			return func(*message.Message) ([]*message.Message, error) {
				runs[i].Add(1)
				return nil, nil
			}
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"PAY-1842"}`))

		// The dead consumers got as far as their handlers, on the other
		// store client: the Deduplicator's marked the key, the
		// middleware's claimed it under a lease of a second.
		dead := &wmw.Deduplicator{
			KeyFactory: wmw.NewMessageHasherSHA256(math.MaxInt64),
			Repository: newRepo(t, peer, expiringkeys.Config{Scope: "deduplicator"}),
			Timeout:    time.Minute,
		}
		if dup, err := dead.IsDuplicate(msg); dup || err != nil {
			t.Fatalf("the dead consumer's IsDuplicate = %t, %v", dup, err)
		}
		keys, err := keyfuncs.PayloadSHA256()(msg)
		if err != nil {
			t.Fatal(err)
		}
		testkit.MustClaim(t, peer, "middleware", time.Second, keys...)

		if _, err := deliver(deduplicator, msg); err != nil {
			t.Fatal(err)
		}
		if n := runs[0].Load(); n != 0 {
			t.Errorf("the Deduplicator ran the redelivery's handler %d times, want 0 (dropped)", n)
		}
		testkit.Eventually(t, time.Minute, "the middleware's redelivery run after the lease", func() error {
			_, err := deliver(ours, msg)
			return err
		})
		if n := runs[1].Load(); n != 1 {
			t.Errorf("the middleware ran the redelivery's handler %d times, want 1", n)
		}
	})
}
