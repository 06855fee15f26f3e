package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// proxied returns a store whose connection goes through a TCP proxy the
// test owns, the proxy, and a direct connection to the same server.
func proxied(t *testing.T, cfg natsstore.Config) (*natsstore.Store, *testkit.Proxy, *nats.Conn, *nats.Conn) {
	t.Helper()
	direct := sharedConn(t)
	p := testkit.NewProxy(t, testkit.NATSAddr())
	nc := connect(t, "nats://"+p.Addr(),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // not nats.go's print to stderr
	if cfg.Bucket == "" {
		cfg.Bucket = testBucket()
	}
	deleteBuckets(t, direct, cfg) // through the direct connection: the proxy may be cut
	return openStore(t, nc, cfg), p, nc, direct
}

// restore restores p and waits for nc to be connected again: on a new
// connection (the proxy closes the ones a Blackhole held, which the
// client notices only then).
func restore(t *testing.T, p *testkit.Proxy, nc *nats.Conn) {
	t.Helper()
	before := nc.Stats().Reconnects
	p.Restore()
	deadline := time.Now().Add(time.Minute)
	for !nc.IsConnected() || nc.Stats().Reconnects == before {
		if time.Now().After(deadline) {
			t.Fatalf("the connection is %s a minute after Restore", nc.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestErrorClasses: a NATS that cannot be reached fails every call at
// once with an error wrapping stores.ErrUnavailable, the only class a
// fail-open consumer may bypass, not at the caller's deadline; one that
// does not answer fails it by the call's deadline, also as an outage;
// bad input, a closed store and a context already done are other
// classes.
func TestErrorClasses(t *testing.T) {
	s, p, nc, _ := proxied(t, natsstore.Config{})
	bg := context.Background()
	held := testkit.MustClaim(t, s, "s", time.Minute, "held")

	// At once, not at the caller's deadline: the calls' deadline is an
	// hour away, and each must return while the proxy is still cut.
	p.Cut()
	ctx, cancel := context.WithTimeout(bg, time.Hour)
	defer cancel()
	for name, call := range map[string]func() error{
		"Claim":    func() error { _, err := s.Claim(ctx, "s", []string{"a"}, time.Minute); return err },
		"Extend":   func() error { return s.Extend(ctx, held, time.Minute) },
		"Complete": func() error { return s.Complete(ctx, held, time.Hour, nil) },
		"Release":  func() error { return s.Release(ctx, held) },
		"Claim of two keys": func() error {
			_, err := s.Claim(ctx, "s", []string{"b", "c"}, time.Minute)
			return err
		},
	} {
		err := testkit.ReturnsDuringOutage(t, name+" on a cut connection", call)
		errtest.Wraps(t, name+", connection cut", err, stores.ErrUnavailable)
	}
	restore(t, p, nc)

	held = testkit.MustClaim(t, s, "s", time.Minute, "held2")
	p.Blackhole()
	testkit.GiveUpUnanswered(t, "a NATS", map[string]func(context.Context) error{
		"Claim":    func(ctx context.Context) error { _, err := s.Claim(ctx, "s", []string{"d"}, time.Minute); return err },
		"Complete": func(ctx context.Context) error { return s.Complete(ctx, held, time.Hour, nil) },
	})
	restore(t, p, nc)
	// Nothing of the blackholed calls landed: the claim completes.
	if err := s.Complete(bg, held, time.Hour, []byte("ok")); err != nil {
		t.Fatalf("Complete after Restore: %v", err)
	}

	// Not outages.
	done, cancelDone := context.WithCancel(bg)
	cancelDone()
	_, err := s.Claim(done, "s", []string{"k"}, time.Minute)
	errtest.NotOutage(t, "Claim with a cancelled context", err, context.Canceled)
	expired, cancelExpired := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancelExpired()
	_, err = s.Claim(expired, "s", []string{"k"}, time.Minute)
	errtest.NotOutage(t, "Claim with an expired context", err, context.DeadlineExceeded)
	errtest.NotOutage(t, "Complete with an expired context", s.Complete(expired, held, time.Hour, nil), context.DeadlineExceeded)
	_, err = s.Claim(bg, "s", []string{""}, time.Minute)
	errtest.NotOutage(t, "Claim of an empty key", err, stores.ErrInvalidKey)
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(bg, "s", []string{"k"}, time.Minute)
	errtest.NotOutage(t, "Claim after Close", err, stores.ErrClosed)
}

// TestStoreOutage cuts the proxy between the store and NATS: calls fail
// at once, nothing they tried reaches the bucket, and after Restore the
// store works again with nothing doubled: the claim held across the cut
// completes, the keys tried during the cut are free, the completed key
// is a duplicate.
func TestStoreOutage(t *testing.T) {
	cfg := natsstore.Config{Bucket: testBucket()}
	s, p, nc, direct := proxied(t, cfg)
	const lease = 5 * time.Second
	call := func(keys ...string) (*stores.Claim, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return s.Claim(ctx, "h", keys, lease)
	}
	held, err := call("before")
	if err != nil || held.Result != stores.Claimed {
		t.Fatalf("Claim before the cut = %v, %v", held, err)
	}
	msgs := streamMsgs(t, direct, cfg.Bucket)

	p.Cut()
	// A call made before nats.go notices the cut may have its write
	// buffered and sent at the reconnect (see the README); the calls
	// checked here come after.
	testkit.WaitFor(t, time.Minute, "the client noticing the cut", func() bool { return !nc.IsConnected() })
	for _, keys := range [][]string{{"during-1"}, {"during-2", "during-3"}, {"before"}} {
		if _, err := call(keys...); !errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("Claim(%q) during the cut = %v, want ErrUnavailable", keys, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err = s.Complete(ctx, held, time.Minute, nil)
	cancel()
	if !errors.Is(err, stores.ErrUnavailable) {
		t.Fatalf("Complete during the cut: %v, want ErrUnavailable", err)
	}
	if n := streamMsgs(t, direct, cfg.Bucket); n != msgs {
		t.Fatalf("%d messages in the bucket after the cut, %d before: a call during the cut reached NATS", n, msgs)
	}

	restore(t, p, nc)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Complete(ctx, held, time.Minute, []byte("ok")); err != nil {
		t.Fatalf("Complete after Restore: %v", err)
	}
	for _, keys := range [][]string{{"during-1"}, {"during-2", "during-3"}} {
		c, err := s.Claim(ctx, "h", keys, lease)
		if err != nil || c.Result != stores.Claimed || c.Takeover {
			t.Fatalf("Claim(%q) after Restore = %+v, %v; want a fresh claim", keys, c, err)
		}
	}
	if d, err := s.Claim(ctx, "h", []string{"before"}, lease); err != nil || d.Result != stores.Duplicate || string(d.Data) != "ok" {
		t.Fatalf("Claim of the completed key after Restore = %+v, %v", d, err)
	}
}

// TestRouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on a natsstore whose connection goes through a TCP proxy the
// test owns, cut in the middle of a stream of messages and duplicate
// deliveries and restored later: fail-closed nacks during the cut and
// never runs the handler for a message it could not claim; after the
// restore every message is applied exactly once and every delivery acked
// (see testkit.RouterOutage).
func TestRouterOutage(t *testing.T) {
	store, proxy, nc, _ := proxied(t, natsstore.Config{})
	testkit.RouterOutage(t, store, proxy.Cut, func() { restore(t, proxy, nc) })
}

// waitFor polls cond until it holds or timeout passes.
var waitFor = testkit.WaitFor

// TestServerRestart: while a NATS server of the test's own is down (its
// port closed) every call fails with stores.ErrUnavailable; while it
// starts again (JetStream recovering its streams, the bucket without a
// leader yet) with that, or, once it listens again and before the
// connection is back up, with natsstore.ErrNotConnected (a server that
// answers a new connection: no known outage), and none with another
// class; once it is up the store works again and the claim held across
// the restart completes.
func TestServerRestart(t *testing.T) {
	srv := startNATS(t, "")
	nc := connect(t, srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	s := newStore(t, nc, natsstore.Config{})
	ctx := context.Background()
	held := claim(t, s, "s", time.Minute, "held")

	srv.stop()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := s.Claim(cctx, "s", []string{"down"}, time.Minute)
	cancel()
	errtest.Wraps(t, "Claim while the server is down", err, stores.ErrUnavailable)

	srv.start("")
	var failed []error
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := s.Claim(cctx, "s", []string{fmt.Sprint("after-", i)}, time.Minute)
		cancel()
		if err == nil {
			break
		}
		failed = append(failed, err)
		if len(failed) > 500 {
			t.Fatalf("the store did not work again after the restart: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, err := range failed {
		if !errors.Is(err, stores.ErrUnavailable) && !errors.Is(err, natsstore.ErrNotConnected) {
			t.Errorf("a call during the restart failed with %v, want ErrUnavailable or ErrNotConnected", err)
		}
	}
	t.Logf("%d calls failed as outages during the restart", len(failed))
	if err := s.Complete(ctx, held, time.Hour, []byte("x")); err != nil {
		t.Fatalf("Complete of the claim held across the restart: %v", err)
	}
}
