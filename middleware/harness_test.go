package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Watermill's built-in Deduplicator, used for comparison, starts a
		// cleanup loop on context.Background() that nothing can stop.
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop"),
	)
}

// newMemstore returns a memstore closed at the end of the test.
func newMemstore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// effects counts effects per logical event, in memory: not on
// testkit/ledger's Mem, whose package's SQL ledger would bring sqlstore and
// its drivers into the middleware's tests.
type effects struct {
	mu       *sync.Mutex
	perEvent map[string]int
}

func newLedger() effects { return effects{mu: &sync.Mutex{}, perEvent: map[string]int{}} }

func (l effects) apply(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.perEvent[id]++
}

func (l effects) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perEvent[id]
}

func (l effects) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.perEvent)
}

// assertExactlyOnce checks that each id has exactly one effect, and that
// nothing else had one.
func (l effects) assertExactlyOnce(t testing.TB, ids []string) {
	t.Helper()
	for _, id := range ids {
		if n := l.count(id); n != 1 {
			t.Errorf("event %s applied %d times, want exactly 1", id, n)
		}
	}
	if n := l.distinct(); n != len(ids) {
		t.Errorf("%d distinct events applied, want %d", n, len(ids))
	}
}

// replyingStore answers its n-th Complete (from 1) with reply, given the
// wrapped store's Complete to run or not: a store that fails, or loses
// the replies of, some of its Completes.
type replyingStore struct {
	stores.Store
	completes atomic.Int32
	reply     func(n int32, complete func() error) error
}

func (s *replyingStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	return s.reply(s.completes.Add(1), func() error { return s.Store.Complete(ctx, c, retention, data) })
}

// lostReply is store whose first Complete lands but answers err, as when
// its reply is lost on the network; a retry finds the record done.
func lostReply(store stores.Store, err error) *replyingStore {
	return &replyingStore{Store: store, reply: func(n int32, complete func() error) error {
		if cerr := complete(); n > 1 || cerr != nil {
			return cerr
		}
		return err
	}}
}

// errNotReplicated stands for redisstore.ErrNotReplicated: an error of a
// store's that wraps no stores sentinel (redisstore's own tests hold it to
// that: never an outage). The middleware's tests keep clear of redisstore
// and its Redis client.
var errNotReplicated = errors.New("redisstore: write not acknowledged by Config.WaitReplicas replicas within WaitTimeout")

// errConnReset is a network error no store classifies.
var errConnReset = errors.New("read tcp 127.0.0.1:50000->127.0.0.1:6379: read: connection reset by peer")

// flakyStore wraps a store; while down, every call fails with errDown.
// It counts the calls that reach it.
type flakyStore struct {
	stores.Store
	down  atomic.Bool
	calls atomic.Int64
}

var errDown = fmt.Errorf("%w: store is down (simulated)", stores.ErrUnavailable)

func (f *flakyStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, errDown
	}
	return f.Store.Claim(ctx, scope, keys, lease)
}

func (f *flakyStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errDown
	}
	return f.Store.Complete(ctx, c, retention, data)
}

func (f *flakyStore) Release(ctx context.Context, c *stores.Claim) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errDown
	}
	return f.Store.Release(ctx, c)
}

func (f *flakyStore) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errDown
	}
	return f.Store.Extend(ctx, c, lease)
}

// publishEvents publishes one message per event ID, each under a new
// UUID, its payload the event ID.
func publishEvents(t testing.TB, pub message.Publisher, topic string, ids []string) {
	t.Helper()
	for _, id := range ids {
		testkit.Publish(t, pub, topic, message.NewMessage(watermill.NewUUID(), []byte(id)))
	}
}

func newMemstoreClock(t testing.TB, clock stores.Clock) *memstore.Store {
	return testkit.Memstore(t, clock)
}

// mayBlock is c without NonBlocking: for wrappers of memstore whose calls
// block, so that the middleware bounds them by StoreTimeout and completes
// in the background in ModeAsyncComplete, as on a networked store.
func mayBlock(c stores.Capabilities) stores.Capabilities {
	c.NonBlocking = false
	return c
}
