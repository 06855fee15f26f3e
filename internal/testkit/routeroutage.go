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
// every delivery acked, and every message recorded done. The outage
// lasts until the middleware felt it, however long a loaded machine takes
// to get there, and no lease or retention runs out because the machine
// was slow.
func RouterOutage(t *testing.T, store stores.Store, cut, restore func()) {
	t.Helper()
	waitFor := WaitFor
	// Exactly-once across the outage needs a Complete that outlasts it: a
	// handler that ran just before the cut completes after the restore.
	// The middleware retries Complete for CompleteTimeout with a doubling
	// backoff, and the record is still the claim's then: the lease is
	// longer than any outage a loaded machine makes of this one, so no
	// duplicate delivery takes a message over while its Complete waits
	// for the store. (A claim whose reply the cut lost holds its key until
	// the lease runs out: the wait for every ack below outlasts it.)
	const lease = time.Minute
	mwLog := watermill.NewCaptureLogger()
	watch := &completeWatch{Store: store, fail: map[string]int{}}
	dedupMW, err := middleware.New(middleware.Config{
		Store: watch,
		Key:   keyfuncs.MessageID(),
		Policy: dedup.Policy{
			Lease:        lease,
			Retention:    time.Hour,
			StoreTimeout: time.Second,
			Tuning:       dedup.Tuning{CompleteTimeout: lease},
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
	// duplicate delivery of an earlier one, tagged with the phase; at least
	// total, and on until some were published after the restore.
	var phase atomic.Value
	phase.Store("before")
	pubDone := make(chan struct{})
	const total = 800 // about 4s of stream: before, during and after the cut
	go func() {
		defer close(pubDone)
		var ids []string
		for i := 0; ; i++ {
			mu.Lock()
			enough := i >= total && byPhase["after"] >= 20
			mu.Unlock()
			if enough || ctx.Err() != nil {
				return
			}
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
	waitFor(t, time.Minute, "messages applied before the cut", func() bool {
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
	// The outage lasts until the middleware felt it: deliveries nacked
	// (gochannel hands a subscriber one delivery at a time, and each
	// attempt fails, at StoreTimeout at the latest), deliveries published
	// meanwhile, and the slow message's Complete failed.
	waitFor(t, time.Minute, "two deliveries nacked, one published and the slow message's Complete failed during the outage", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return nacks.Load()-nacksAtCut >= 2 && byPhase["cut"] > 0 && watch.failed(slow.UUID) > 0
	})
	restored.Store(true)
	restore()
	phase.Store("after")
	// A duplicate delivery of the message whose Complete fell in the
	// outage, once that message was acked (its Complete retried across
	// the outage): a duplicate, not a rerun.
	waitFor(t, time.Minute, "the slow message acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return acked[slow.UUID] > 0
	})
	dup := message.NewMessage(slow.UUID, []byte("slow"))
	dup.Metadata.Set("phase", "after")
	publish(dup)
	<-pubDone

	// Every delivery is acked eventually (a claim whose reply the cut lost
	// holds its key until the lease runs out, then is taken over).
	waitFor(t, lease+2*time.Minute, "every delivery acked", func() bool {
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
		// Acked with its record done: a Complete that gave up (acked
		// anyway) would let a duplicate after the lease run it again.
		if c, err := store.Claim(context.Background(), "outage", []string{id}, lease); err != nil || c.Result != stores.Duplicate {
			t.Errorf("message %s: acked, but its record is not done: a claim of it = %+v, %v", id, c, err)
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

// completeWatch is a store that counts, per key, the Completes that
// failed.
type completeWatch struct {
	stores.Store
	mu   sync.Mutex
	fail map[string]int // by key
}

func (w *completeWatch) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	err := w.Store.Complete(ctx, c, retention, data)
	if err != nil {
		w.mu.Lock()
		for _, k := range c.Keys {
			w.fail[k]++
		}
		w.mu.Unlock()
	}
	return err
}

func (w *completeWatch) failed(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fail[key]
}
