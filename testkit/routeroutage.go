package testkit

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// RouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on store, whose connection the test can cut and restore (a
// Proxy between the store's client and its service). Messages, and
// duplicate deliveries of them, are published continuously; cut is called
// in the middle of the stream and restore later. Fail-closed must nack
// during the cut and never run the handler for a message it could not
// claim; after the restore every message must be applied exactly once and
// every delivery acked. A store keeps a claim's record for one more lease
// after the lease ran out, which the Complete retried across the outage
// relies on.
func RouterOutage(t *testing.T, store stores.Store, cut, restore func()) {
	t.Helper()
	waitFor := WaitFor
	// Exactly-once across the outage needs a Complete that outlasts it: a
	// handler that ran just before the cut completes after the restore.
	// The middleware retries Complete for CompleteTimeout (default: the
	// lease) with a doubling backoff, more than the 2s outage; the record
	// is still the claim's then.
	const lease = 3 * time.Second
	mwLog := watermill.NewCaptureLogger()
	dedupMW, err := middleware.New(middleware.Config{
		Store: store,
		Key:   keyfuncs.MessageID(),
		Policy: dedup.Policy{
			Lease:        lease,
			Retention:    time.Minute,
			StoreTimeout: 300 * time.Millisecond,
			Tuning:       dedup.Tuning{CompleteTimeout: 5 * time.Second},
			OnStoreError: dedup.FailClosed,
			Logger:       mwLog,
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu        sync.Mutex
		published = map[string]int{} // deliveries published per message
		byPhase   = map[string]int{} // deliveries published per phase
		acked     = map[string]int{} // deliveries acked per message
		applied   = map[string]int{} // handler runs per message
		early     []string           // cut-phase messages run before Restore
		restored  atomic.Bool
		nacks     atomic.Int64
	)
	// Outermost: count what the router acks and nacks.
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				nacks.Add(1)
			} else {
				mu.Lock()
				acked[msg.UUID]++
				mu.Unlock()
			}
			return out, err
		}
	}
	// A short in-process retry plays the broker's redelivery delay:
	// gochannel resends a nacked message at once.
	retry := wmmiddleware.Retry{MaxRetries: 1, InitialInterval: 20 * time.Millisecond}

	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 512}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(count, retry.Middleware, dedupMW.Middleware)
	// One message is in its handler when the cut starts, so its Complete
	// certainly falls in the outage.
	slowEntered, slowRelease := make(chan struct{}, 1), make(chan struct{})
	router.AddConsumerHandler("outage", "orders", pubsub, func(msg *message.Message) error {
		if msg.Metadata.Get("slow") == "1" {
			select {
			case slowEntered <- struct{}{}:
			default:
			}
			<-slowRelease
		}
		mu.Lock()
		defer mu.Unlock()
		applied[msg.UUID]++
		if msg.Metadata.Get("phase") == "cut" && !restored.Load() {
			early = append(early, msg.UUID)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-routerDone; err != nil {
			t.Errorf("router: %v", err)
		}
		_ = pubsub.Close()
	})
	<-router.Running()

	// The publisher: a new message every 5ms, and every third tick a
	// duplicate delivery of an earlier one, tagged with the phase.
	var phase atomic.Value
	phase.Store("before")
	pubDone := make(chan struct{})
	const total = 800 // about 4s of stream: before, during and after the cut
	go func() {
		defer close(pubDone)
		var ids []string
		for i := range total {
			var m *message.Message
			if i%3 == 2 {
				m = message.NewMessage(ids[i%len(ids)], []byte("dup"))
			} else {
				m = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
				ids = append(ids, m.UUID)
			}
			m.Metadata.Set("phase", phase.Load().(string))
			mu.Lock()
			published[m.UUID]++
			byPhase[m.Metadata.Get("phase")]++
			mu.Unlock()
			if err := pubsub.Publish("orders", m); err != nil {
				t.Errorf("publish: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	// Cut mid-stream, once some messages went through.
	waitFor(t, 10*time.Second, "messages applied before the cut", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) >= 20
	})
	slow := message.NewMessage(watermill.NewUUID(), []byte("slow"))
	slow.Metadata.Set("slow", "1")
	slow.Metadata.Set("phase", "before")
	publish := func(m *message.Message) {
		mu.Lock()
		published[m.UUID]++
		byPhase[m.Metadata.Get("phase")]++
		mu.Unlock()
		if err := pubsub.Publish("orders", m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	publish(slow)
	<-slowEntered
	cut()
	phase.Store("cut")
	close(slowRelease)
	nacksAtCut := nacks.Load()
	// The outage. gochannel hands a subscriber one delivery at a time, and
	// each attempt during the cut fails at StoreTimeout: a nack every ~0.6s.
	time.Sleep(2 * time.Second)
	if n := nacks.Load() - nacksAtCut; n < 2 {
		t.Errorf("%d deliveries nacked during the outage, want at least 2", n)
	}
	restored.Store(true)
	restore()
	phase.Store("after")
	// A duplicate delivery of the message whose Complete fell in the
	// outage, after its lease would have run out: a duplicate, not a rerun.
	time.Sleep(lease + lease/4)
	dup := message.NewMessage(slow.UUID, []byte("slow"))
	dup.Metadata.Set("phase", "after")
	publish(dup)
	<-pubDone

	// Every delivery is acked eventually (a claim whose reply the cut lost
	// holds its key until the lease runs out, then is taken over).
	waitFor(t, 40*time.Second, "every delivery acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id, n := range published {
			if acked[id] < n {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if len(early) > 0 {
		t.Errorf("the handler ran during the outage for %d messages it could not have claimed: %v", len(early), early)
	}
	for id := range published {
		if applied[id] != 1 {
			t.Errorf("message %s applied %d times, want exactly once", id, applied[id])
		}
		if acked[id] != published[id] {
			t.Errorf("message %s: %d deliveries, %d acks", id, published[id], acked[id])
		}
	}
	if t.Failed() {
		for _, m := range mwLog.Captured()[watermill.ErrorLogLevel] {
			t.Logf("middleware error log: %s: %v %v", m.Msg, m.Err, m.Fields)
		}
	}
	if len(applied) != len(published) {
		t.Errorf("%d messages applied, %d published", len(applied), len(published))
	}
	for _, p := range []string{"before", "cut", "after"} {
		if byPhase[p] == 0 {
			t.Errorf("no delivery published %s the cut", p)
		}
	}
	t.Logf("%d messages, deliveries by phase %v, %d nacks", len(published), byPhase, nacks.Load())
}

// WaitFor polls cond until it holds, or fails t after timeout, naming
// what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
