package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// proxied returns a store on the server of direct whose connection goes
// through a TCP proxy the test owns, the proxy, and direct, a connection
// to the same server that the proxy does not cut.
func proxied(t *testing.T, direct *nats.Conn, cfg natsstore.Config) (*natsstore.Store, *testkit.Proxy, *nats.Conn, *nats.Conn) {
	t.Helper()
	p := testkit.NewProxy(t, direct.ConnectedAddr())
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
	onServers(t, func(t *testing.T, direct *nats.Conn) {
		s, p, nc, _ := proxied(t, direct, natsstore.Config{})
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
		errtest.ContextNotOutage(t, s, held)
		_, err := s.Claim(bg, "s", []string{""}, time.Minute)
		errtest.NotOutage(t, "Claim of an empty key", err, stores.ErrInvalidKey)
		if err := s.Close(bg); err != nil {
			t.Fatal(err)
		}
		_, err = s.Claim(bg, "s", []string{"k"}, time.Minute)
		errtest.NotOutage(t, "Claim after Close", err, stores.ErrClosed)
	})
}

// TestStoreOutage cuts the proxy between the store and NATS: calls fail
// at once, nothing they tried reaches the bucket, and after Restore the
// store works again with nothing doubled: the claim held across the cut
// completes, the keys tried during the cut are free, the completed key
// is a duplicate.
func TestStoreOutage(t *testing.T) {
	onServers(t, func(t *testing.T, direct *nats.Conn) {
		cfg := natsstore.Config{Bucket: testBucket()}
		s, p, nc, direct := proxied(t, direct, cfg)
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
	})
}

// TestRouterOutage runs a real Watermill router (gochannel) with the dedup
// middleware on a natsstore whose connection goes through a TCP proxy the
// test owns, cut in the middle of a stream of messages and duplicate
// deliveries and restored later: fail-closed nacks during the cut and
// never runs the handler for a message it could not claim; after the
// restore every message is applied exactly once and every delivery acked
// (see testkit.RouterOutage).
func TestRouterOutage(t *testing.T) {
	onServers(t, func(t *testing.T, direct *nats.Conn) {
		store, proxy, nc, _ := proxied(t, direct, natsstore.Config{})
		testkit.RouterOutage(t, store, proxy.Cut, func() { restore(t, proxy, nc) })
	})
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
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		srv := startNATS(t, bin, "")
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
	})
}

// An error is an outage only when it is known to be one: a server that
// refuses the client (its credentials, its TLS) is not unavailable,
// whatever nats.go makes of the refusal (an authorization violation, a
// TLS alert that crypto/tls returns as a network error, a connection
// closed right after the TLS handshake, a reconnecting or closed
// connection), and neither is a reset or an EOF of the next attempts of
// a connection the server refused. FailOpen would run handlers through
// an outage, unprotected, for as long as the settings stay wrong.

// waitLastError waits until nc's last error holds want (a refused
// reconnect) and nc is not connected.
func waitLastError(t *testing.T, nc *nats.Conn, want string) {
	t.Helper()
	testkit.WaitFor(t, time.Minute, "the reconnect refused ("+want+")", func() bool {
		err := nc.LastError()
		return !nc.IsConnected() && err != nil && strings.Contains(strings.ToLower(err.Error()), want)
	})
}

// redirectDialer is a nats.CustomDialer whose target the test switches:
// the server, or a port that resets every connection it accepts.
type redirectDialer struct{ target atomic.Pointer[string] }

func (r *redirectDialer) to(target string) { r.target.Store(&target) }

func (r *redirectDialer) Dial(network, _ string) (net.Conn, error) {
	return net.DialTimeout(network, *r.target.Load(), 5*time.Second)
}

// TestReconnectRefusalIsNotAnOutage: a store whose connection the server
// refuses at its reconnect: the user removed at a config reload (nats.go
// then closes the connection after the second refusal, or, with
// IgnoreAuthErrorAbort, goes on reconnecting), or its TLS client
// certificate no longer trusted after one. Every call fails unclassified
// once the server refused the reconnect, also when the next attempts
// meet a reset, and no handler of a fail-open consumer runs; a
// connection up again works.
func TestReconnectRefusalIsNotAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

		for _, keepTrying := range []bool{false, true} {
			name := "the user removed"
			if keepTrying {
				name += ", IgnoreAuthErrorAbort"
			}
			t.Run(name, func(t *testing.T) {
				srv := bin.Start(t, usersConf("root", "alice"), nats.UserInfo("root", "root-pw"))
				r := &redirectDialer{}
				r.to(srv.Addr())
				opts := []nats.Option{nats.UserInfo("alice", "alice-pw"), nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond),
					nats.ReconnectJitter(0, 0), nats.SetCustomDialer(r), quiet}
				if keepTrying {
					opts = append(opts, nats.IgnoreAuthErrorAbort())
				}
				nc := connect(t, srv.URL(), opts...)
				cfg := natsstore.Config{Bucket: testBucket()}
				newStore(t, connect(t, srv.URL(), nats.UserInfo("root", "root-pw")), cfg) // the bucket, made and deleted by root
				s := openStore(t, nc, cfg)
				if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
					t.Fatalf("Claim before the reload = %s", c.Result)
				}

				srv.Reload(usersConf("root"))
				waitLastError(t, nc, "authorization violation")
				testkit.RefusedCalls(t, s, 5, "authorization violation", true)
				if ran, err := testkit.FailOpenRun(t, s, 5); ran != 0 || err == nil {
					t.Fatalf("FailOpen with the user removed: %d of 5 handlers ran unprotected, last error %v", ran, err)
				}
				if keepTrying {
					// The next attempts meet resets: the same refusal.
					r.to(testkit.Closing(t, true))
					testkit.WaitFor(t, time.Minute, "a reconnect that meets a reset", func() bool {
						err := nc.LastError()
						return err != nil && !strings.Contains(strings.ToLower(err.Error()), "authorization")
					})
					testkit.RefusedCalls(t, s, 5, "authorization violation", true)
					// The user is back: the store works again.
					r.to(srv.Addr())
					srv.Reload(usersConf("root", "alice"))
					testkit.WaitFor(t, time.Minute, "the reconnect", nc.IsConnected)
					if c := claim(t, s, "s", time.Minute, "after"); c.Result != stores.Claimed {
						t.Fatalf("Claim once the user is back = %s", c.Result)
					}
				}
			})
		}

		t.Run("the client certificate no longer trusted", func(t *testing.T) {
			files, other := testkit.MakeTLSFiles(t), testkit.MakeTLSFiles(t)
			tlsConf := func(ca string) string {
				return "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + ca + "\"\n  verify: true\n}\n"
			}
			withCert := []nats.Option{nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey)}
			srv := bin.Start(t, tlsConf(files.CA), withCert...)
			nc := connect(t, "tls://"+srv.Addr(), append(withCert, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0), quiet)...)
			s := newStore(t, nc, natsstore.Config{})
			if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
				t.Fatalf("Claim before the reload = %s", c.Result)
			}
			// The server now trusts another authority only; the connection up
			// keeps going until it reconnects.
			srv.Reload(tlsConf(other.CA))
			if err := nc.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
			waitLastError(t, nc, "tls")
			testkit.RefusedCalls(t, s, 5, "tls", true)
			if ran, err := testkit.FailOpenRun(t, s, 5); ran != 0 || err == nil {
				t.Fatalf("FailOpen with a client certificate no longer trusted: %d of 5 handlers ran unprotected, last error %v", ran, err)
			}
			// Trusted again: the store works again.
			srv.Reload(tlsConf(files.CA))
			testkit.WaitFor(t, time.Minute, "the reconnect", nc.IsConnected)
			if c := claim(t, s, "s", time.Minute, "after"); c.Result != stores.Claimed {
				t.Fatalf("Claim once the certificate is trusted again = %s", c.Result)
			}
		})
	})
}

// TestConnectRefusedIsNotAnOutage: Connect to a server that refuses the
// client's TLS (no client certificate where one is required) or its
// credentials fails unclassified; to a port where nothing listens, as an
// outage.
func TestConnectRefusedIsNotAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		files := testkit.MakeTLSFiles(t)
		conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + files.CA + "\"\n  verify: true\n}\n" +
			"authorization {\n  users = [\n    {user: alice, password: alice-pw}\n  ]\n}\n"
		addr := bin.Start(t, conf, nats.UserInfo("alice", "alice-pw"), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey)).Addr()
		ctx := context.Background()
		for name, opts := range map[string][]nats.Option{
			"without a client certificate": {nats.UserInfo("alice", "alice-pw"), nats.RootCAs(files.CA)},
			"with a wrong password":        {nats.UserInfo("alice", "wrong"), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey)},
			"not trusting the server":      {nats.UserInfo("alice", "alice-pw"), nats.ClientCert(files.ClientCert, files.ClientKey)},
		} {
			_, err := natsstore.Connect(ctx, "tls://"+addr, natsstore.Config{Bucket: testBucket()}, append(opts, nats.Timeout(10*time.Second))...)
			if err == nil || errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, natsstore.ErrRefused) {
				t.Errorf("Connect %s: %v, want ErrRefused, not an outage", name, err)
			}
		}
		_, err := natsstore.Connect(ctx, "nats://"+testkit.ClosedAddr(t), natsstore.Config{Bucket: testBucket()}, nats.Timeout(time.Second))
		if !errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("Connect to a port where nothing listens: %v, want an outage", err)
		}
	})
}

// TestDeletedBucketIsNotAnOutage: a bucket deleted under a store (its
// stream gone) makes nothing answer the store's writes (no responders):
// not an outage, which FailOpen would run handlers through until the
// bucket is made again, but an error wrapping
// jetstream.ErrBucketNotFound that names the bucket. (A read of the
// deleted stream, a direct get, gets no answer at all: it times out, and
// a timeout stays an outage; a single-key claim writes first.)
func TestDeletedBucketIsNotAnOutage(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		bucket := testBucket()
		s := newStore(t, nc, natsstore.Config{Bucket: bucket})
		ctx := context.Background()
		claim(t, s, "s", time.Minute, "held")
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteKeyValue(ctx, bucket); err != nil {
			t.Fatal(err)
		}
		for _, keys := range [][]string{{"new"}, {"held"}} {
			_, err := s.Claim(ctx, "s", keys, time.Minute)
			if err == nil || errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, jetstream.ErrBucketNotFound) || !strings.Contains(err.Error(), bucket) {
				t.Errorf("Claim(%q) in a deleted bucket: %v, want ErrBucketNotFound naming %s, not an outage", keys, err, bucket)
			}
		}
		if ran, err := testkit.FailOpenRun(t, s, 3); ran != 0 || err == nil {
			t.Fatalf("FailOpen on a deleted bucket: %d of 3 handlers ran unprotected, last error %v", ran, err)
		}
	})
}

// usersConf is a server config whose users (each with password
// name-pw) may do anything.
func usersConf(names ...string) string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, n := range names {
		b.WriteString("    {user: " + n + ", password: " + n + "-pw}\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// TestSessionClosedIsNotAnOutage: the user is removed at a config reload
// and the server closes its session (an EOF, no word of why, as when it
// stops). Until a reconnect attempt says why (here never: ReconnectWait
// is an hour), the connection is RECONNECTING while the server is up and
// answers a new connection: no known outage, and a fail-open consumer
// runs no handler (nats.go's default ReconnectWait is 2s, and every call
// of that window was an outage). Once nothing listens any more, with or
// without a refusal before, it is one.
func TestSessionClosedIsNotAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
		t.Run("before the first reconnect", func(t *testing.T) {
			srv := bin.Start(t, usersConf("root", "alice"), nats.UserInfo("root", "root-pw"))
			cfg := natsstore.Config{Bucket: testBucket()}
			openStore(t, connect(t, srv.URL(), nats.UserInfo("root", "root-pw")), cfg) // the bucket, on a server the test kills
			nc := connect(t, srv.URL(), nats.UserInfo("alice", "alice-pw"), nats.ReconnectWait(time.Hour), quiet)
			s := openStore(t, nc, cfg)
			if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
				t.Fatalf("Claim before the reload = %s", c.Result)
			}
			srv.Reload(usersConf("root"))
			testkit.WaitFor(t, time.Minute, "the server closing the session", func() bool { return nc.Status() == nats.RECONNECTING })
			refusedNoFailOpen(t, s, 5, "not known to be an outage", "n", natsstore.ErrNotConnected, "while reconnecting, the session closed by a server that is up")
			srv.Kill()
			outageCalls(t, s, "the server killed")
		})
		t.Run("after a refusal", func(t *testing.T) {
			srv := bin.Start(t, usersConf("root", "alice"), nats.UserInfo("root", "root-pw"))
			cfg := natsstore.Config{Bucket: testBucket()}
			openStore(t, connect(t, srv.URL(), nats.UserInfo("root", "root-pw")), cfg) // the bucket, on a server the test kills
			nc := connect(t, srv.URL(), nats.UserInfo("alice", "alice-pw"), nats.MaxReconnects(-1), nats.IgnoreAuthErrorAbort(),
				nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0), quiet)
			s := openStore(t, nc, cfg)
			srv.Reload(usersConf("root"))
			waitLastError(t, nc, "authorization violation")
			testkit.RefusedCalls(t, s, 3, "authorization violation", true)
			// The server dies: nothing listens. The refusal remembered does
			// not make that a refusal.
			srv.Kill()
			outageCalls(t, s, "the server killed after it refused the client")
		})
	})
}

// outageCalls makes 3 Claims on s and checks each fails with an outage.
func outageCalls(t *testing.T, s *natsstore.Store, what string) {
	t.Helper()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := s.Claim(ctx, "s", []string{"down-" + string(rune('a'+i))}, time.Minute)
		cancel()
		if !errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("Claim %d, %s: %v, want ErrUnavailable", i, what, err)
		}
	}
}

// firedDeadline is a context whose deadline the test decides: Done is
// closed, and Err is context.DeadlineExceeded, once fire is called.
type firedDeadline struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newFiredDeadline() *firedDeadline {
	return &firedDeadline{Context: context.Background(), done: make(chan struct{})}
}

func (c *firedDeadline) fire()                       { c.once.Do(func() { close(c.done) }) }
func (c *firedDeadline) Done() <-chan struct{}       { return c.done }
func (c *firedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(time.Hour), true }
func (c *firedDeadline) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestPermissionDeniedOnSharedConnection: the store shares its
// connection with the application (a publisher of its own, a broker's
// acks). The user loses its publish permissions at a config reload; the
// store's claim is denied (the server's only answer is a permissions
// violation reported to the connection, the request just times out), and
// so is the application's next publish, whose violation replaces the
// connection's LastError before the claim's deadline. The claim still
// fails as denied, not as an outage, and a fail-open consumer runs no
// handler.
func TestPermissionDeniedOnSharedConnection(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		conf := func(alicePub string) string {
			return "authorization {\n  users = [\n    {user: root, password: root-pw}\n" +
				"    {user: alice, password: alice-pw, permissions: {publish: {allow: " + alicePub + "}, subscribe: {allow: [\">\"]}}}\n  ]\n}\n"
		}
		srv := bin.Start(t, conf(`[">"]`), nats.UserInfo("root", "root-pw"))
		cfg := natsstore.Config{Bucket: testBucket()}
		newStore(t, connect(t, srv.URL(), nats.UserInfo("root", "root-pw")), cfg)
		// The application's error handler publishes, on the same connection,
		// after each violation of the store's: denied too.
		var nc *nats.Conn
		var appDenied atomic.Int64
		nc = connect(t, srv.URL(), nats.UserInfo("alice", "alice-pw"), nats.MaxReconnects(-1),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				switch msg := err.Error(); {
				case strings.Contains(msg, "orders.created"):
					appDenied.Add(1)
				case strings.Contains(msg, "$KV."):
					_ = nc.Publish("orders.created", []byte("x"))
				}
			}))
		s := openStore(t, nc, cfg)
		if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
			t.Fatalf("Claim before the reload = %s", c.Result)
		}
		srv.Reload(conf(`["app.>"]`)) // the store's subjects are no longer allowed

		for i := range 3 {
			ctx := newFiredDeadline()
			before := appDenied.Load()
			done := make(chan error, 1)
			go func() {
				_, err := s.Claim(ctx, "s", []string{"denied-" + string(rune('a'+i))}, time.Minute)
				done <- err
			}()
			// The deadline passes once the application's violation came after
			// the store's and is the connection's last error.
			testkit.WaitFor(t, time.Minute, "the application's publish denied after the store's claim", func() bool {
				last := nc.LastError()
				return appDenied.Load() > before && last != nil && strings.Contains(last.Error(), "orders.created")
			})
			ctx.fire()
			err := <-done
			if err == nil || errors.Is(err, stores.ErrUnavailable) || cycle.IsOutage(err) || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("Claim %d denied, the application's violation last: %v, want the store's permissions violation, not an outage", i, err)
			}
		}

		// Through a fail-open middleware whose store calls time out after 1s.
		mw, err := middleware.New(middleware.Config{Store: s, Policy: dedup.Policy{
			Lease: time.Minute, Retention: time.Hour, StoreTimeout: time.Second, OnStoreError: dedup.FailOpen, Logger: watermill.NopLogger{}}})
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil })
		for range 3 {
			if _, err := h(message.NewMessage(watermill.NewUUID(), []byte("p"))); err == nil {
				t.Fatal("a message acked while the store is denied")
			}
		}
		if ran != 0 {
			t.Fatalf("FailOpen with the store's permissions removed: %d of 3 handlers ran unprotected", ran)
		}
	})
}

// TestAccountWithoutJetStreamIsNotAnOutage: the user is moved at a
// config reload to an account without JetStream. The server lets the
// connection in again, and nothing answers the store's requests (no
// responders): JetStream says the account has none (10039), a setting to
// fix, not an outage (which FailOpen would run handlers through until it
// is fixed).
func TestAccountWithoutJetStreamIsNotAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		conf := func(aliceIn string) string {
			a, b := "", ""
			if aliceIn == "A" {
				a = ", {user: alice, password: alice-pw}"
			} else {
				b = ", {user: alice, password: alice-pw}"
			}
			return "accounts {\n  A: {jetstream: enabled, users: [{user: root, password: root-pw}" + a + "]}\n" +
				"  B: {users: [{user: bob, password: bob-pw}" + b + "]}\n}\n"
		}
		srv := bin.Start(t, conf("A"), nats.UserInfo("root", "root-pw"))
		cfg := natsstore.Config{Bucket: testBucket()}
		newStore(t, connect(t, srv.URL(), nats.UserInfo("root", "root-pw")), cfg)
		nc := connect(t, srv.URL(), nats.UserInfo("alice", "alice-pw"), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		s := openStore(t, nc, cfg)
		if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
			t.Fatalf("Claim before the reload = %s", c.Result)
		}
		srv.Reload(conf("B"))
		testkit.WaitFor(t, time.Minute, "the connection up again, in account B", func() bool {
			return nc.Stats().Reconnects > 0 && nc.IsConnected()
		})
		refusedNoFailOpen(t, s, 3, "jetstream not enabled for account", "b", jetstream.ErrJetStreamNotEnabledForAccount, "in an account without JetStream")
	})
}

// TestServerGoneForGoodIsAnOutage: nats.go gives up on a server killed
// for good after its MaxReconnects and closes the connection, emptying
// its server pool: every call is then an outage still, the store asking
// the servers the connection was given.
func TestServerGoneForGoodIsAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		srv := bin.Start(t, "")
		closed := make(chan struct{})
		nc := connect(t, srv.URL(), nats.MaxReconnects(2), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		s := openStore(t, nc, natsstore.Config{Bucket: testBucket()})
		if c := claim(t, s, "s", time.Minute, "before"); c.Result != stores.Claimed {
			t.Fatalf("Claim before the kill = %s", c.Result)
		}
		srv.Kill()
		<-closed
		outageCalls(t, s, "the connection closed after its reconnects ran out")
	})
}

// TestHungServerIsAnOutage: a server that accepts connections (its
// kernel does) and says nothing, stopped with SIGSTOP, over nats:// and
// over a websocket: every call is an outage once the connection is not
// up, never ErrNotConnected.
func TestHungServerIsAnOutage(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		ws := freePort(t)
		srv := bin.Start(t, fmt.Sprintf("websocket {\n  listen: \"127.0.0.1:%d\"\n  no_tls: true\n}\n", ws))
		for _, url := range []string{srv.URL(), fmt.Sprintf("ws://127.0.0.1:%d", ws)} {
			t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
				nc := connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(time.Second),
					nats.PingInterval(100*time.Millisecond), nats.MaxPingsOutstanding(2),
					nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
				s := openStore(t, nc, natsstore.Config{Bucket: testBucket()})
				srv.Pause()
				t.Cleanup(srv.Resume)
				testkit.WaitFor(t, time.Minute, "the connection found stale", func() bool { return !nc.IsConnected() })
				outageCalls(t, s, "the server hung")
				srv.Resume()
				testkit.WaitFor(t, time.Minute, "the connection up again", nc.IsConnected)
			})
		}
	})
}

// freePort returns a loopback port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// refusedNoFailOpen checks that n calls of s are refused with text and not
// as an outage, that n-2 claims fail with want, and that a fail-open
// consumer runs none of n handlers; what names the situation.
func refusedNoFailOpen(t *testing.T, s *natsstore.Store, n int, text, keyPrefix string, want error, what string) {
	t.Helper()
	testkit.RefusedCalls(t, s, n, text, true)
	for i := range n - 2 {
		_, err := s.Claim(context.Background(), "s", []string{keyPrefix + string(rune('a'+i))}, time.Minute)
		if !errors.Is(err, want) {
			t.Fatalf("Claim %s: %v, want %v", what, err, want)
		}
	}
	if ran, err := testkit.FailOpenRun(t, s, n); ran != 0 || err == nil {
		t.Fatalf("FailOpen %s: %d of %d handlers ran unprotected, last error %v", what, ran, n, err)
	}
}
