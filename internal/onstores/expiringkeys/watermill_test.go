package expiringkeys_test

// Watermill's own tests of its Deduplicator (message/router/middleware's
// deduplicator_test.go, v1.5.1), run with a Repository on every store:
// TestDeduplicatorMiddleware, TestDeduplicatorPublisherDecorator and
// TestMapExpiringKeyRepositoryCleanup. Its hasher tests do not involve a
// repository.

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
)

// hashers are the Deduplicator's key factories: each makes binary keys
// (4 bytes of Adler-32, 32 of SHA-256) that every store must keep apart.
var hashers = []struct {
	name string
	new  func(readLimit int64) wmw.MessageHasher
}{
	{"adler32", wmw.NewMessageHasherAdler32},
	{"sha256", wmw.NewMessageHasherSHA256},
}

// Watermill's TestDeduplicatorMiddleware: of six messages with one
// payload and two with another, two reach the handler. Here the handlers
// are two, one per store client, as in two processes, and the messages
// alternate between them.
func TestDeduplicatorMiddleware(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		for _, hasher := range hashers {
			t.Run(hasher.name, func(t *testing.T) {
				var mu sync.Mutex
				count := 0
				var handlers []message.HandlerFunc
				for _, s := range []stores.Store{store, peer} {
					d := &wmw.Deduplicator{
						KeyFactory: hasher.new(1024),
						Repository: newRepo(t, s, expiringkeys.Config{Scope: "middleware-" + hasher.name}),
						Timeout:    time.Minute,
					}
					handlers = append(handlers, d.Middleware(func(*message.Message) ([]*message.Message, error) {
						mu.Lock()
						count++
						mu.Unlock()
						return nil, nil
					}))
				}
				for i := range 6 { // only one should go through
					if _, err := handlers[i%2](message.NewMessage(fmt.Sprintf("first%d", i), []byte("1"))); err != nil {
						t.Fatal(err)
					}
				}
				for i := range 2 { // only one should go through
					if _, err := handlers[i%2](message.NewMessage(fmt.Sprintf("second%d", i), []byte("2"))); err != nil {
						t.Fatal(err)
					}
				}
				if count != 2 {
					t.Fatalf("the handler ran %d times, want 2", count)
				}
			})
		}
	})
}

// Watermill's TestDeduplicatorPublisherDecorator: of six messages with
// one payload and two with another published through the decorator, two
// reach the topic, and the duplicates are acked. Where Watermill's test
// reads the topic until a 50ms deadline, this one counts what the
// decorator passes on to the pub/sub, then reads that many.
func TestDeduplicatorPublisherDecorator(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 100, Persistent: true}, watermill.NopLogger{})
		t.Cleanup(func() { _ = pubSub.Close() })
		const topic = "testTopic"
		passed := &recorder{Publisher: pubSub}

		var decorated []message.Publisher
		for _, s := range []stores.Store{store, peer} {
			d := &wmw.Deduplicator{
				KeyFactory: wmw.NewMessageHasherAdler32(1024),
				Repository: newRepo(t, s, expiringkeys.Config{Scope: "publisher"}),
				Timeout:    time.Minute,
			}
			p, err := d.PublisherDecorator()(passed)
			if err != nil {
				t.Fatal(err)
			}
			decorated = append(decorated, p)
		}
		var dropped []*message.Message
		publish := func(i int, msg *message.Message) {
			if err := decorated[i%2].Publish(topic, msg); err != nil {
				t.Fatal(err)
			}
			if i > 0 {
				dropped = append(dropped, msg)
			}
		}
		for i := range 6 { // only one should go through
			publish(i, message.NewMessage(fmt.Sprintf("first%d", i), []byte("1")))
		}
		for i := range 2 { // only one should go through
			publish(i, message.NewMessage(fmt.Sprintf("second%d", i), []byte("2")))
		}
		if got := passed.uuids(); fmt.Sprint(got) != "[first0 second0]" {
			t.Fatalf("the decorator published %v, want [first0 second0]", got)
		}
		for _, m := range dropped {
			select {
			case <-m.Acked():
			default:
				t.Errorf("the duplicate %s was not acked", m.UUID)
			}
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got, err := pubSub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		received := map[string]bool{}
		for m := range got {
			m.Ack()
			received[m.UUID] = true
			if len(received) == 2 {
				break
			}
		}
		if !received["first0"] || !received["second0"] {
			t.Fatalf("the topic got %v, want first0 and second0", received)
		}
	})
}

// recorder is a publisher that records the messages of every Publish
// that succeeded.
type recorder struct {
	message.Publisher
	mu   sync.Mutex
	msgs []*message.Message
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	if err := r.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	r.mu.Lock()
	r.msgs = append(r.msgs, msgs...)
	r.mu.Unlock()
	return nil
}

func (r *recorder) uuids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		out = append(out, m.UUID)
	}
	return out
}

// Watermill's TestMapExpiringKeyRepositoryCleanup: six different
// messages all reach the handler, each key is then remembered, and
// forgotten once the window is over. The map's Len is, here, each key
// checked again: true while it is remembered, false (marked anew) once
// forgotten.
func TestRepositoryForgetsKeysAfterTheWindow(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		const window = 300 * time.Millisecond
		repo := newRepo(t, store, expiringkeys.Config{Scope: "expiring", Window: window})
		count := 0
		d := &wmw.Deduplicator{Repository: repo, KeyFactory: wmw.NewMessageHasherAdler32(1024), Timeout: time.Minute}
		h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
			count++
			return nil, nil
		})
		var keys []string
		start := time.Now()
		for i := range 6 {
			msg := message.NewMessage(fmt.Sprintf("expiring%d", i), fmt.Appendf(nil, "expiring%d", i))
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
			key, err := d.KeyFactory(msg)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, key)
		}
		if count != 6 {
			t.Fatalf("sent six different messages, the handler ran %d times", count)
		}
		// Checked on the other client. On a machine too loaded to check
		// within the window a key may be forgotten already (and is then
		// marked anew, for the window): only what is checked within it
		// must be remembered.
		other := newRepo(t, peer, expiringkeys.Config{Scope: "expiring", Window: window})
		for i, key := range keys {
			dup, err := other.IsDuplicate(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if !dup && time.Since(start) < window {
				t.Fatalf("key %d is not remembered within the window", i)
			}
		}
		forgotten := make([]bool, len(keys))
		testkit.WaitFor(t, 30*time.Second, "every key forgotten after the window", func() bool {
			all := true
			for i, key := range keys {
				if forgotten[i] {
					continue
				}
				dup, err := repo.IsDuplicate(context.Background(), key)
				if err != nil {
					t.Fatal(err)
				}
				forgotten[i] = !dup
				all = all && forgotten[i]
			}
			return all
		})
	})
}

// N callers, on two store clients, check the same key at once: exactly
// one gets false, the others true (those racing with its mark too), and
// none an error. Many rounds, a key each.
func TestConcurrentCallersOneFirst(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		const callers, rounds = 16, 10
		repos := []*expiringkeys.Repository{
			newRepo(t, store, expiringkeys.Config{Scope: "concurrent"}),
			newRepo(t, peer, expiringkeys.Config{Scope: "concurrent"}),
		}
		for round := range rounds {
			key := fmt.Sprintf("key-%d", round)
			start := make(chan struct{})
			results := make(chan error, callers)
			firsts := make(chan int, callers)
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					<-start
					dup, err := repos[i%2].IsDuplicate(context.Background(), key)
					if err == nil && !dup {
						firsts <- i
					}
					results <- err
				})
			}
			close(start)
			wg.Wait()
			close(results)
			close(firsts)
			for err := range results {
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if n := len(firsts); n != 1 {
				t.Fatalf("round %d: %d of %d callers got false, want exactly one", round, n, callers)
			}
		}
	})
}

// Binary keys that differ in one byte, or only in length, are different
// keys on every store, and a key of the store's longest length is kept.
func TestBinaryKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		repo := newRepo(t, store, expiringkeys.Config{Scope: "binary"})
		keys := []string{"\x00", "\x00\x00", "\x00\x01", "\xff\xfe", "a\x00b", "a:b", "a", "A"}
		if max := store.Capabilities().MaxKey; max > 0 {
			keys = append(keys, string(make([]byte, max)))
		} else {
			keys = append(keys, string(make([]byte, math.MaxUint16)))
		}
		for _, key := range keys {
			mustSee(t, repo, key, false, fmt.Sprintf("the first check of %q", key))
		}
		for _, key := range keys {
			mustSee(t, repo, key, true, fmt.Sprintf("the second check of %q", key))
		}
	})
}

// A key held by another caller (a claim in progress) is seen at once
// with a negative InProgressWait. Otherwise the call waits for it: seen
// when that caller marks it, marked by this call when that caller gives
// it back or leaves it held until its lease runs out.
func TestKeyHeldByAnotherCaller(t *testing.T) {
	forEachStore(t, func(t *testing.T, store, peer stores.Store) {
		t.Run("seen at once", func(t *testing.T) {
			repo := newRepo(t, store, expiringkeys.Config{Scope: "held-at-once", InProgressWait: -1})
			c := testkit.MustClaim(t, peer, "held-at-once", time.Minute, "k")
			mustSee(t, repo, "k", true, "another caller holds the key")
			if err := peer.Release(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			mustSee(t, repo, "k", false, "the other caller released the key")
		})
		settle := map[string]func(c *stores.Claim) error{
			"marked":     func(c *stores.Claim) error { return peer.Complete(context.Background(), c, time.Minute, nil) },
			"given back": func(c *stores.Claim) error { return peer.Release(context.Background(), c) },
		}
		want := map[string]bool{"marked": true, "given back": false}
		for name, settle := range settle {
			t.Run(name, func(t *testing.T) {
				scope := "held-" + strings.ReplaceAll(name, " ", "-")
				waiting := &testkit.HookStore{Store: store}
				repo := newRepo(t, waiting, expiringkeys.Config{Scope: scope})
				c := testkit.MustClaim(t, peer, scope, time.Minute, "k")
				got := make(chan bool, 1)
				go func() {
					dup, err := repo.IsDuplicate(context.Background(), "k")
					if err != nil {
						t.Errorf("IsDuplicate: %v", err)
					}
					got <- dup
				}()
				testkit.WaitFor(t, 30*time.Second, "the call claiming the held key again", func() bool { return waiting.Claims.Load() >= 2 })
				if err := settle(c); err != nil {
					t.Fatal(err)
				}
				if dup := <-got; dup != want[name] {
					t.Fatalf("IsDuplicate while the other caller's claim was %s = %t, want %t", name, dup, want[name])
				}
			})
		}
		t.Run("left held", func(t *testing.T) {
			repo := newRepo(t, store, expiringkeys.Config{Scope: "held-left"})
			testkit.MustClaim(t, peer, "held-left", time.Second, "k")
			mustSee(t, repo, "k", false, "the other caller's lease ran out: the key is taken over")
			mustSee(t, repo, "k", true, "the key was marked")
		})
	})
}
