package expiringkeys_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
)

// A store that is down (Cut: connections refused) or does not answer
// (Blackhole) fails the Deduplicator's delivery with the store's error,
// without running the handler or dropping the message: the router nacks
// it, and once the store is back its redelivery runs, once.
func TestStoreOutageNacksTheMessage(t *testing.T) {
	for _, kind := range []anystore.StoreKind{anystore.StoreRedis, anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreNATS} {
		for _, outage := range []string{"cut", "blackhole"} {
			t.Run(string(kind)+"/"+outage, func(t *testing.T) {
				proxy := testkit.NewProxy(t, anystore.RequireStore(t, kind))
				store := openStore(t, anystore.StoreParams{Kind: kind, Addr: proxy.Addr(), CreateSchema: true, Teardown: true}).Store
				repo := newRepo(t, store, expiringkeys.Config{Scope: "outage"})
				var runs atomic.Int32
				handler := func(*message.Message) ([]*message.Message, error) {
					runs.Add(1)
					return nil, nil
				}
				deduplicator := func(timeout time.Duration) message.HandlerFunc {
					d := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherSHA256(1024), Repository: repo, Timeout: timeout}
					return d.Middleware(handler)
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte("order 1842"))

				if outage == "cut" {
					proxy.Cut()
				} else {
					proxy.Blackhole()
				}
				during := deduplicator(300 * time.Millisecond)
				err := testkit.ReturnsDuringOutage(t, "the Deduplicator's delivery", func() error {
					_, err := deliver(during, msg)
					return err
				})
				if !errors.Is(err, dedup.ErrStore) || (!errors.Is(err, stores.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded)) {
					t.Fatalf("the delivery during the outage returned %v, want an error wrapping dedup.ErrStore and an outage", err)
				}
				if n := runs.Load(); n != 0 {
					t.Fatalf("the handler ran %d times during the outage", n)
				}

				proxy.Restore()
				after := deduplicator(time.Minute)
				testkit.Eventually(t, time.Minute, "the redelivery handled once the store is back", func() error {
					_, err := deliver(after, msg)
					return err
				})
				if _, err := deliver(after, msg); err != nil {
					t.Fatal(err)
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times, want once: the redelivery after the outage", n)
				}
			})
		}
	}
}

// A store slower than the Deduplicator's Timeout: the mark fails with
// the Timeout's error (the message is nacked), but its Claim reaches the
// store all the same and holds the key, on Redis and PostgreSQL (not on
// MySQL or NATS, where this test cannot make it). The redelivery waits for
// that claim's lease to run out (InProgressWait), takes the key over and
// runs the handler, instead of dropping the message as seen.
func TestRedeliveryAfterATimedOutMarkRuns(t *testing.T) {
	for _, kind := range []anystore.StoreKind{anystore.StoreRedis, anystore.StorePostgres} {
		t.Run(string(kind), func(t *testing.T) {
			proxy := testkit.NewProxy(t, anystore.RequireStore(t, kind))
			o := openStore(t, anystore.StoreParams{Kind: kind, Addr: proxy.Addr(), CreateSchema: true, Teardown: true})
			direct := openStore(t, anystore.StoreParams{Kind: kind, Name: o.Name}).Store.(stores.Admin)
			repo := newRepo(t, o.Store, expiringkeys.Config{Scope: "slow", Lease: 2 * time.Second})
			mustSee(t, repo, "warm-up", false, "a first call, to connect")
			var runs atomic.Int32
			d := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherSHA256(1024), Repository: repo, Timeout: 300 * time.Millisecond}
			h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
				runs.Add(1)
				return nil, nil
			})
			msg := message.NewMessage(watermill.NewUUID(), []byte("order 1842"))
			key, err := d.KeyFactory(msg)
			if err != nil {
				t.Fatal(err)
			}

			proxy.SetLatency(400 * time.Millisecond) // a round trip is longer than the Timeout
			if _, err := deliver(h, msg); !errors.Is(err, dedup.ErrStore) {
				t.Fatalf("the delivery through a store slower than the Timeout returned %v, want an error wrapping dedup.ErrStore", err)
			}
			proxy.SetLatency(0)
			testkit.WaitFor(t, 30*time.Second, "the timed-out Claim holding the key", func() bool {
				rec, err := direct.Get(context.Background(), "slow", key)
				return err == nil && rec.State == stores.StateProcessing
			})
			d.Timeout = time.Minute
			if _, err := deliver(h, msg); err != nil {
				t.Fatalf("the redelivery: %v", err)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once: the redelivery", n)
			}
		})
	}
}
