package redisstore_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dedupcycle "github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// An error is an outage only when it is known to be one, each error on
// its own: a server that answered the store before and now turns it
// away (its certificate revoked, TLS required from now on) is not
// unavailable, whether the refusal reads as the server's TLS alert, a
// reset or an EOF. FailOpen would run every handler through an outage,
// unprotected, for a client the server will never take again.

// TestRefusedAfterAnAnswerIsNotAnOutage: the store's client is answered,
// then the server behind its address stops taking it. Every claim after
// that fails with no outage, and FailOpen runs no handler.
func TestRefusedAfterAnAnswerIsNotAnOutage(t *testing.T) {
	t.Run("client certificate revoked, the reset overtaking the alert", func(t *testing.T) {
		// A TLS 1.3 server that requires a client certificate checks it
		// after the client's side of the handshake is done: its alert,
		// and the close that follows, reach the client on its first
		// write or read, and now and then the close overtakes the alert
		// (the client's write meets a reset). The gate forwards to a
		// real TLS Redis while the certificate is good, then stands in
		// for a server that no longer takes it and resets every new
		// connection after the client's first write, without the alert.
		addr, files := redistest.StartRedisTLS(t, true)
		g := newGate(t, addr)
		s := gatedStore(t, g, files.ClientConfig(t, true))
		g.refuse(files)
		refusedAfterAnswer(t, s, g)
		if g.resets.Load() == 0 {
			t.Error("no connection was reset")
		}
	})

	t.Run("TLS only from now on, a client in plain text", func(t *testing.T) {
		// The server behind the address is now a Redis that speaks TLS
		// only (port 0, tls-port N): it closes every connection of a
		// client speaking plain text (an EOF, or a reset). It is up, and
		// will not take the client until its settings change: no outage.
		// Not ErrRefused either: the server says nothing, and a
		// connection taken and closed without a word is also what a
		// server dropping a client, or a proxy in front of a server
		// that is down, does; no known outage, unclassified.
		tlsOnly, _ := redistest.StartRedisTLS(t, false)
		g := newGate(t, startRedis(t))
		s := gatedStore(t, g, nil)
		g.forwardTo(tlsOnly)
		refusedAfterAnswer(t, s, g)
	})

	t.Run("client certificate no longer trusted by the server", func(t *testing.T) {
		// No stand-in: the real server stops trusting the client
		// certificate's authority and drops the store's connections.
		// Its refusal is its TLS alert, ErrRefused, now and then a
		// reset: never an outage.
		addr, files := redistest.StartRedisTLS(t, true)
		g := newGate(t, addr)
		s := gatedStore(t, g, files.ClientConfig(t, true))
		admin := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, true), MaxRetries: -1, PoolSize: 1})
		defer admin.Close()
		ctx := context.Background()
		if err := admin.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The admin's connection, set up before, stays.
		if err := admin.ConfigSet(ctx, "tls-ca-cert-file", testkit.MakeTLSFiles(t).CA).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Do(ctx, "client", "kill", "type", "normal", "skipme", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		kinds := refusedAfterAnswer(t, s, g)
		if kinds["ErrRefused"] == 0 {
			t.Errorf("no claim failed with ErrRefused: %v", kinds)
		}
	})
}

// refusedAfterAnswer checks that the claims of s, whose server answered
// it and now refuses it, never fail as outages: through a FailOpen
// middleware, which must run no handler, then directly. It drops the
// gate's connections first (the server closes the sessions of a client
// it no longer takes), and returns how many claims failed with
// ErrRefused, how many unclassified, and how many of each kind.
func refusedAfterAnswer(t *testing.T, s *redisstore.Store, g *gate) map[string]int {
	t.Helper()
	g.drop()
	const n = 20
	ran, err := testkit.FailOpenRun(t, s, n)
	if ran != 0 {
		t.Errorf("FailOpen ran %d of %d handlers UNPROTECTED on a server that answered the store and now refuses it (the last claim: %v)", ran, n, err)
	}
	if err == nil {
		t.Error("FailOpen acked a message the store could not claim")
	}
	kinds := map[string]int{}
	outages := 0
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := s.Claim(ctx, "s", []string{"after-" + strconv.Itoa(i)}, time.Minute)
		cancel()
		switch {
		case err == nil:
			t.Fatal("the client was let in")
		case errors.Is(err, stores.ErrUnavailable) || dedupcycle.IsOutage(err):
			if outages++; outages == 1 {
				t.Errorf("claim %d: %v: an outage, want a refusal or no class", i, err)
			}
		case errors.Is(err, redisstore.ErrRefused):
			kinds["ErrRefused"]++
		default:
			kinds["unclassified"]++
		}
		kinds[refusal(err)]++
	}
	if outages > 0 {
		t.Errorf("%d of %d claims failed as an outage", outages, n)
	}
	t.Logf("claims: %v", kinds)
	return kinds
}

// TestTLSRefusalIsNotAnOutage: a TLS 1.3 server that requires a client
// certificate refuses a client without one after the client's side of
// the handshake is done, so the client learns it on its first write or
// read: mostly as the server's alert, but now and then as a reset, when
// the server's close overtakes the alert. A TLS port closes on a client
// that speaks plain text (EOF). Neither is an outage, which FailOpen
// would run handlers through, unprotected, for as long as the settings
// stay wrong: every call must fail with ErrRefused (the alert) or
// unclassified (a reset or an EOF, which a new connection refused in
// the same way confirms as no outage).
func TestTLSRefusalIsNotAnOutage(t *testing.T) {
	addr, files := redistest.StartRedisTLS(t, true)
	kinds := map[string]int{}
	// claims makes n claims through a store of its own on a client of
	// opts (without retries: each call a new connection, refused).
	claims := func(t *testing.T, opts redis.Options, n int) {
		t.Helper()
		opts.MaxRetries, opts.ContextTimeoutEnabled = -1, true
		c := redis.NewClient(&opts)
		defer c.Close()
		s, err := redisstore.New(c, redisstore.Config{Prefix: "dedup-test-refused:", SkipServerCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		outages, first := 0, error(nil)
		for i := range n {
			_, err := s.Claim(context.Background(), "s", []string{"k" + strconv.Itoa(i)}, time.Minute)
			if err == nil {
				t.Fatal("the client was let in")
			}
			kinds[t.Name()+": "+refusal(err)]++
			if errors.Is(err, stores.ErrUnavailable) || dedupcycle.IsOutage(err) {
				outages++
				first = cmp.Or(first, err)
			}
		}
		if outages > 0 {
			t.Errorf("%d of %d calls failed as an outage, the first: %v", outages, n, first)
		}
	}

	t.Run("without a certificate", func(t *testing.T) {
		claims(t, redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, false)}, 2000)
	})
	t.Run("in plain text", func(t *testing.T) {
		claims(t, redis.Options{Addr: addr}, 100)
	})
	t.Run("reset after the alert", func(t *testing.T) {
		// The server's first refusal is its alert; every connection after
		// it, the reset that overtakes the alert, on the client's first
		// write: the gate stands in for it there (it asks for a
		// certificate, and resets a client that gave none).
		g := newGate(t, addr)
		opts := redis.Options{Addr: g.addr(), TLSConfig: files.ClientConfig(t, false)}
		claims(t, opts, 1)
		g.refuse(files)
		claims(t, opts, 19)
		if g.resets.Load() == 0 {
			t.Fatal("no connection was reset")
		}
	})
	t.Logf("refusals: %v", kinds)
}

// refusal names the kind of error a refused connection gave.
func refusal(err error) string {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "remote error":
		return "TLS alert"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	}
	return err.Error()
}

// gatedStore returns a store on a client (TLS when cfg is set) of the
// gate, after a claim the server behind the gate answered.
func gatedStore(t *testing.T, g *gate, cfg *tls.Config) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: g.addr(), TLSConfig: cfg, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1, DialTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Config{Prefix: "dedup-test-refused-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
	cl, err := s.Claim(context.Background(), "s", []string{"before"}, time.Minute)
	if err != nil || cl.Result != stores.Claimed {
		t.Fatalf("a claim before: %+v, %v", cl, err)
	}
	return s
}

// gate listens on a loopback port and forwards every connection it
// accepts to a target, which the test switches; or, once refusing, acts
// as a TLS 1.3 server that asks for a client certificate, takes none
// (none is of the authority it trusts now), and resets each connection
// after the client's first write: the reset that overtakes a refusing
// server's alert.
type gate struct {
	ln     net.Listener
	resets atomic.Int64
	wg     sync.WaitGroup

	mu      sync.Mutex
	target  string
	refusal *tls.Config // set while refusing
	open    map[net.Conn]struct{}
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, open: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		g.drop()
		g.wg.Wait()
	})
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

// forwardTo forwards the connections accepted from now on to target.
func (g *gate) forwardTo(target string) {
	g.mu.Lock()
	g.target, g.refusal = target, nil
	g.mu.Unlock()
}

// refuse refuses the connections accepted from now on, as a server with
// files' server certificate (which the client trusts).
func (g *gate) refuse(files *testkit.TLSFiles) {
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		panic(err)
	}
	g.mu.Lock()
	g.refusal = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS13}
	g.mu.Unlock()
}

// drop closes every connection the gate forwards.
func (g *gate) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.open {
		_ = c.Close()
	}
}

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		target, refusal := g.target, g.refusal
		g.mu.Unlock()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if refusal != nil {
				g.reset(c, refusal)
				return
			}
			g.forward(c, target)
		}()
	}
}

// reset completes the TLS handshake of c as a server asking for a client
// certificate, reads the client's first write and resets c.
func (g *gate) reset(c net.Conn, cfg *tls.Config) {
	tc := tls.Server(c, cfg)
	if tc.Handshake() == nil {
		_, _ = tc.Read(make([]byte, 1))
		g.resets.Add(1)
	}
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

// forward copies c to and from a new connection to target until either
// side closes, or drop closes both.
func (g *gate) forward(c net.Conn, target string) {
	s, err := net.Dial("tcp", target)
	if err != nil {
		_ = c.Close()
		return
	}
	g.mu.Lock()
	g.open[c], g.open[s] = struct{}{}, struct{}{}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(s, c)
		_ = s.Close()
		close(done)
	}()
	_, _ = io.Copy(c, s)
	_ = c.Close()
	<-done
	g.mu.Lock()
	delete(g.open, c)
	delete(g.open, s)
	g.mu.Unlock()
}

// TestBrokenConnectionToAServerGoneIsAnOutage: a claim in flight when the
// server goes away (its connection closed, nothing listening any more)
// fails as an outage, although its own error is only a broken
// connection (an EOF, a reset): a new connection, refused, confirms it.
func TestBrokenConnectionToAServerGoneIsAnOutage(t *testing.T) {
	addr := testkit.RequireRedis(t)
	for _, batched := range []bool{true, false} {
		t.Run("batched="+strconv.FormatBool(batched), func(t *testing.T) {
			p, c := proxiedClient(t, addr, redis.Options{MaxRetries: -1, DialTimeout: 5 * time.Second})
			h := &sendHook{sent: make(chan struct{}, 1)}
			c.AddHook(redistest.RedisTap(h.signal))
			s := newStore(t, c, redisstore.Config{Prefix: testPrefix(t, newClient(t, addr)), Batch: redisstore.BatchConfig{Disabled: !batched}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.Claim(ctx, "s", []string{"before"}, time.Minute); err != nil {
				t.Fatal(err)
			}
			// The claim goes out into a server that does not answer, and
			// the server goes away while the claim waits for its reply.
			p.Blackhole()
			h.armed.Store(true)
			done := make(chan error, 1)
			go func() {
				_, err := s.Claim(ctx, "s", []string{"in-flight"}, time.Minute)
				done <- err
			}()
			<-h.sent
			p.Cut()
			err := <-done
			if !errors.Is(err, stores.ErrUnavailable) {
				t.Errorf("a claim in flight when the server went away: %v, want an outage", err)
			}
			t.Logf("%v", err)
		})
	}
}

// sendHook signals sent when a command or a pipeline is about to go out,
// once armed (its signal is the client's redistest.RedisTap).
type sendHook struct {
	armed atomic.Bool
	sent  chan struct{}
}

func (h *sendHook) signal([]redis.Cmder) {
	if h.armed.Load() {
		select {
		case h.sent <- struct{}{}:
		default:
		}
	}
}
