package middleware_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// roundTrips counts what a go-redis client sends: one per command sent
// alone, one per pipeline (its add is the client's redistest.RedisTap).
type roundTrips struct {
	n   atomic.Int64
	mu  sync.Mutex
	log []string
}

func (r *roundTrips) add(cmds []redis.Cmder) {
	if name := cmds[0].Name(); name == "hello" || name == "client" || name == "config" {
		return // a new connection's handshake, the store's one look at the server's limits
	}
	r.n.Add(1)
	var names []string
	for _, c := range cmds {
		names = append(names, fmt.Sprint(c.Args()[:min(len(c.Args()), 4)]))
	}
	r.mu.Lock()
	r.log = append(r.log, fmt.Sprint(names))
	r.mu.Unlock()
}

// lingerStore returns a redisstore on the shared Redis, under a prefix of
// its own that is deleted afterwards, and its client.
func lingerStore(t *testing.T) (*redis.Client, *redisstore.Store) {
	t.Helper()
	addr := testkit.RequireRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	prefix := fmt.Sprintf("dedup-linger-%d:", time.Now().UnixNano())
	t.Cleanup(func() { _ = redisclean.DeletePrefix(context.Background(), client, prefix) })
	store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	return client, store
}

// TestAsyncCompleteGoesOutWithTheNextClaim: on a sequential consumer in
// ModeAsyncComplete on Redis, each message's background Complete goes
// out in one round trip with the next message's Claim
// (Tuning.CompleteLinger): no Complete goes out on its own, n messages
// cost n+1 round trips, not 2n (30 for 20 before the linger), and every
// record is done. The linger is far longer than the test, so that nothing
// depends on how fast the machine is; the last Complete is carried by one
// more Claim, and one that a busy machine queued late (or a retry) by the
// claims that check the records.
func TestAsyncCompleteGoesOutWithTheNextClaim(t *testing.T) {
	client, store := lingerStore(t)
	// Scripts loaded before counting: a first EVALSHA would be answered
	// NOSCRIPT and sent again. The Complete's is the one SHA the warm
	// Complete sends; the claim script runs for a key found processing.
	var completeSHA atomic.Value
	tap := redistest.RedisTap(func(cmds []redis.Cmder) {
		// EVALSHA sha numkeys key...: the warm Complete's, on its keys.
		if args := cmds[0].Args(); len(args) > 3 && cmds[0].Name() == "evalsha" && strings.HasSuffix(fmt.Sprint(args[3]), ":warm:k") && completeSHA.Load() == nil {
			completeSHA.Store(args[1])
		}
	})
	warm, err := store.Claim(context.Background(), "warm", []string{"k", "p"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(context.Background(), "warm", []string{"p"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	client.AddHook(tap)
	if err := store.Complete(context.Background(), warm, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if completeSHA.Load() == nil {
		t.Fatal("the warm Complete sent no EVALSHA on its keys")
	}
	trips := &roundTrips{}
	var alone []string // Completes sent in a round trip of their own
	var failed []string
	client.AddHook(redistest.RedisTap(func(cmds []redis.Cmder) {
		trips.add(cmds)
		for _, c := range cmds {
			if args := c.Args(); len(cmds) == 1 && c.Name() == "evalsha" && len(args) > 1 && args[1] == completeSHA.Load() {
				trips.mu.Lock()
				alone = append(alone, fmt.Sprint(args[:min(len(args), 4)]))
				trips.mu.Unlock()
			}
		}
	}))
	client.AddHook(redistest.RedisDone(func(cmds []redis.Cmder) {
		for _, c := range cmds {
			if name := c.Name(); name == "hello" || name == "client" {
				continue // a new connection's handshake, which an older server may refuse
			}
			if err := c.Err(); err != nil && err != redis.Nil {
				trips.mu.Lock()
				failed = append(failed, fmt.Sprintf("%v: %v", c.Args()[:min(len(c.Args()), 4)], err))
				trips.mu.Unlock()
			}
		}
	}))

	mw := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{
		Lease: time.Hour, StoreTimeout: time.Hour, Tuning: dedup.Tuning{CompleteLinger: 30 * time.Minute},
	}})
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const n = 20
	for i := range n {
		if _, err := h(message.NewMessage(fmt.Sprintf("m-%d", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	// The last Complete goes out with a call that comes after it: a Claim
	// of the last message, which is then a duplicate (the Complete goes
	// first in the pipeline). The background Complete may not have been
	// queued yet: claim until it is. Such a Claim may take two round
	// trips (SET NX GET finds the record processing, then the script
	// reads its lease).
	carriers := 0
	testkit.WaitFor(t, 10*time.Second, "the last Complete carried", func() bool {
		carriers++
		c, err := store.Claim(context.Background(), "s", []string{fmt.Sprintf("m-%d", n-1)}, time.Minute)
		return err == nil && c.Result == stores.Duplicate
	})
	got := trips.n.Load()
	// Every record done: a Complete queued after the claims above (its
	// goroutine held up, or retried after a failure) goes out with the
	// claims that check.
	for i := range n {
		testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("m-%d's Complete carried", i), func() bool {
			c, err := store.Claim(context.Background(), "s", []string{fmt.Sprintf("m-%d", i)}, time.Minute)
			return err == nil && c.Result == stores.Duplicate
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := mw.Close(ctx); err != nil {
		t.Fatalf("Close: %v (a Complete never went out)", err)
	}
	trips.mu.Lock()
	defer trips.mu.Unlock()
	if len(failed) > 0 {
		t.Logf("commands that failed: %v", failed)
	}
	if len(alone) > 0 {
		t.Fatalf("%d Completes went out on their own: %v; round trips: %v", len(alone), alone, trips.log)
	}
	if want := int64(n + 2*carriers); got > want {
		t.Fatalf("%d round trips for %d messages and %d more claims, want at most %d: the Completes went out on their own: %v", got, n, carriers, want, trips.log)
	}
}

// TestAsyncCompleteLingerEndsOnItsOwn: with nothing else to carry it, a
// background Complete goes out after CompleteLinger, and Close returns.
func TestAsyncCompleteLingerEndsOnItsOwn(t *testing.T) {
	_, store := lingerStore(t)
	mw := testkit.AsyncMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteLinger: 20 * time.Millisecond}}})
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := mw.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c, err := store.Claim(context.Background(), "s", []string{"m-1"}, time.Minute)
	if err != nil || c.Result != stores.Duplicate {
		t.Fatalf("%v, %v; want a duplicate", c.Result, err)
	}
}

// TestLingerDuplicatesRunOnce: consumers sharing one middleware deliver
// duplicates, one after another and at once (a duplicate arriving while
// its own Complete lingers waits for it), under lingers from 1µs to
// 200ms: each message's handler runs exactly once, and after Close every
// record is done.
func TestLingerDuplicatesRunOnce(t *testing.T) {
	_, store := lingerStore(t)
	for round, linger := range []time.Duration{time.Microsecond, time.Millisecond, 20 * time.Millisecond, 200 * time.Millisecond, 0} {
		scope := fmt.Sprint("s", round)
		mw, err := middleware.New(middleware.Config{Store: store, Scope: scope, Mode: dedup.ModeAsyncComplete,
			Policy: dedup.Policy{InProgressWait: time.Minute, Tuning: dedup.Tuning{CompleteLinger: linger, InProgressPoll: time.Millisecond}}})
		if err != nil {
			t.Fatal(err)
		}
		var runs sync.Map
		h := mw.Middleware(func(m *message.Message) ([]*message.Message, error) {
			v, _ := runs.LoadOrStore(m.UUID, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			return nil, nil
		})
		const n, workers = 300, 6
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					id := fmt.Sprint("m-", (i+w*(i%2))%(n/3))
					if _, err := h(message.NewMessage(id, nil)); err != nil {
						t.Errorf("linger %s: %s: %v", linger, id, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = mw.Close(ctx)
		cancel()
		if err != nil {
			t.Fatalf("linger %s: Close: %v", linger, err)
		}
		runs.Range(func(k, v any) bool {
			if c := v.(*atomic.Int32).Load(); c != 1 {
				t.Errorf("linger %s: %v ran %d times", linger, k, c)
			}
			c, err := store.Claim(context.Background(), scope, []string{k.(string)}, time.Minute)
			if err != nil || c.Result != stores.Duplicate {
				t.Errorf("linger %s: %v: %v %v, want a duplicate", linger, k, c.Result, err)
			}
			return true
		})
	}
}
