package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// undoHook holds every pipeline that carries a script call on key until
// release is closed, whatever its context: a node that takes as long as
// the test likes to answer, on one key.
type undoHook struct {
	key     string
	entered chan struct{} // closed when the first such pipeline is held
	once    sync.Once
	release chan struct{}
}

// arm makes h hold the next pipeline again, and returns what lets it
// go: a func that closes release once, called when t ends if not before.
func (h *undoHook) arm(t *testing.T) (release func()) {
	h.entered, h.once, h.release = make(chan struct{}), sync.Once{}, make(chan struct{})
	return closer(t, h.release)
}

func (h *undoHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *undoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *undoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.hold(cmds)
		return next(ctx, cmds)
	}
}

func (h *undoHook) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); (n == "evalsha" || n == "eval") && cmdKey(c) == h.key {
			h.once.Do(func() { close(h.entered) })
			<-h.release
			return
		}
	}
}

// testUndoNeverHoldsTheCaller: a multi-key claim over two nodes that
// takes its first key and finds the second held gives the first back;
// the caller does not wait for that past its deadline, however long the
// node takes to answer (here: until the test lets it), and the key is
// free once it has.
func testUndoNeverHoldsTheCaller(t *testing.T, addrs []string) {
	h := &undoHook{}
	cc := hookedCluster(t, addrs, h)
	for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
		release := h.arm(t)
		s, err := redisstore.New(cc, redisstore.Config{Prefix: testPrefix(t, cc), SkipServerCheck: true, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		first, second := onTwoNodes(t, cc, s, "h") // claimed in this order
		if _, err := s.Claim(context.Background(), "h", []string{second}, time.Minute); err != nil {
			t.Fatal(err)
		}
		h.key = s.EncodeKey("h", first)

		ctx, cancel := context.WithCancel(context.Background())
		type answer struct {
			c   *stores.Claim
			err error
		}
		done := make(chan answer, 1)
		go func() {
			c, err := s.Claim(ctx, "h", []string{first, second}, time.Minute)
			done <- answer{c, err}
		}()
		<-h.entered // the first key is being given back, held by its node
		cancel()
		select {
		case a := <-done:
			if a.err == nil && a.c.Result != stores.InProgress || a.err != nil && !errors.Is(a.err, context.Canceled) {
				t.Errorf("Claim(%q, %q), the second held = %v, %v; want in progress, or the context's error", first, second, a.c, a.err)
			}
		case <-time.After(time.Minute): // only a caller held by the undo waits this long
			t.Fatalf("Claim(%q, %q) has not returned a minute after its context ended: its undo holds it (batch %+v)", first, second, batch)
		}
		release()
		testkit.WaitFor(t, time.Minute, "the first key given back", func() bool {
			c, err := s.Claim(context.Background(), "h", []string{first}, time.Minute)
			return err == nil && c.Result == stores.Claimed
		})
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// onTwoNodes returns two keys whose records in scope are on different
// nodes, the first's Redis key before the second's.
func onTwoNodes(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, scope string) (string, string) {
	t.Helper()
	ctx := context.Background()
	node := func(k string) string {
		c, err := cc.MasterForKey(ctx, s.EncodeKey(scope, k))
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	for range 1000 {
		id := storetest.NewID()
		if a, b := "a-"+id, "b-"+id; node(a) != node(b) {
			return a, b
		}
	}
	t.Fatal("no two keys on two nodes")
	return "", ""
}

// testUndoWaitsForNoOtherNode: a multi-key claim over three nodes that
// takes its first two keys and finds the third held gives the two back,
// each on its node; a node that takes as long as the test likes to answer
// (here: until the test lets it) holds up the give-back of its own key
// only. The other key is given back while that node still holds its
// own, also when its node must be sent the script again (NOSCRIPT: it
// has not cached it, as after a failover or a restart).
func testUndoWaitsForNoOtherNode(t *testing.T, addrs []string) {
	h := &undoHook{}
	cc := hookedCluster(t, addrs, h)
	ctx := context.Background()
	for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
		release := h.arm(t)
		s, err := redisstore.New(cc, redisstore.Config{Prefix: testPrefix(t, cc), SkipServerCheck: true, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		keys := ascendingOnThreeNodes(t, cc, s, "h")
		// The third key is held: the claim gives back the first two.
		if _, err := s.Claim(ctx, "h", keys[2:], time.Minute); err != nil {
			t.Fatal(err)
		}
		h.key = s.EncodeKey("h", keys[1]) // its node holds its give-back
		first, err := cc.MasterForKey(ctx, s.EncodeKey("h", keys[0]))
		if err != nil {
			t.Fatal(err)
		}
		if err := first.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The caller (no deadline) waits for its give-backs, the held
		// one too.
		type answer struct {
			c   *stores.Claim
			err error
		}
		done := make(chan answer, 1)
		go func() {
			c, err := s.Claim(ctx, "h", keys, time.Minute)
			done <- answer{c, err}
		}()
		select {
		case <-h.entered: // the second key's give-back, held by its node
		case a := <-done:
			t.Fatalf("Claim(%q), the third held = %v, %v before the second key's give-back went out", keys, a.c, a.err)
		}
		testkit.WaitFor(t, time.Minute, "the first key given back while the second key's node holds its own give-back", func() bool {
			n, err := first.Exists(ctx, s.EncodeKey("h", keys[0])).Result()
			return err == nil && n == 0
		})
		release()
		if a := <-done; a.err != nil || a.c.Result != stores.InProgress {
			t.Fatalf("Claim(%q), the third held = %v, %v; want in progress", keys, a.c, a.err)
		}
		testkit.WaitFor(t, time.Minute, "the second key given back", func() bool {
			c, err := s.Claim(ctx, "h", keys[1:2], time.Minute)
			return err == nil && c.Result == stores.Claimed
		})
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// ascendingOnThreeNodes returns three keys whose records in scope are on
// three different nodes, in ascending order of their Redis keys.
func ascendingOnThreeNodes(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, scope string) []string {
	t.Helper()
	ctx := context.Background()
	node := func(k string) string {
		c, err := cc.MasterForKey(ctx, s.EncodeKey(scope, k))
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	for range 10000 {
		// Ids of their own: CRC16 is linear, so keys that differ in one
		// byte are a fixed number of slots apart.
		keys := []string{"a-" + storetest.NewID(), "b-" + storetest.NewID(), "c-" + storetest.NewID()}
		if a, b, c := node(keys[0]), node(keys[1]), node(keys[2]); a != b && b != c && a != c {
			return keys
		}
	}
	t.Fatal("no three keys on three nodes")
	return nil
}

// hookedCluster returns a cluster client on addrs with hook on every
// node; it is closed when t ends.
func hookedCluster(t *testing.T, addrs []string, hook redis.Hook) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	cc.OnNewNode(func(c *redis.Client) { c.AddHook(hook) })
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// closer returns a func that closes ch on its first call and does
// nothing on the next ones; t calls it when it ends.
func closer(t *testing.T, ch chan struct{}) func() {
	var once sync.Once
	f := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(f)
	return f
}
