package redisstore_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dedupcycle "github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestTLS runs the conformance suite over TLS, on a redis-server of its
// own that speaks TLS only and requires a client certificate, with
// certificates of a private CA the test makes; and checks that a client
// that does not trust the CA, or has no certificate, is refused.
func TestTLS(t *testing.T) {
	addr, files := testkit.StartRedisTLS(t, true)
	newTLSClient := func(t testing.TB, withCert bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, withCert), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	client := newTLSClient(t, true)
	storetest.Run(t, factory(client, redisstore.Config{}), serverTime(client))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newStore(t, client, redisstore.Config{})
	if err := s.CheckServer(ctx); err != nil {
		t.Errorf("CheckServer over TLS: %v", err)
	}
	if _, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil {
		t.Fatal(err)
	}

	t.Run("refused", func(t *testing.T) {
		// A server that refuses the client's certificate (its TLS alert:
		// none given, or one of another CA) refuses a setting, as it
		// does a wrong password: not an outage, which FailOpen would run
		// handlers through, unprotected, for as long as it lasts.
		other := testkit.MakeTLSFiles(t)
		otherCert := files.ClientConfig(t, false)
		otherCert.Certificates = other.ClientConfig(t, true).Certificates
		for name, cfg := range map[string]*tls.Config{"without a certificate": files.ClientConfig(t, false), "with a certificate of another CA": otherCert} {
			c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			_, err := newStore(t, c, redisstore.Config{Prefix: s.Prefix()}).Claim(ctx, "s", []string{"k"}, time.Minute)
			if err == nil {
				t.Errorf("a client %s was let in", name)
			} else if errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, redisstore.ErrRefused) || !strings.Contains(err.Error(), "remote error: tls") {
				t.Errorf("a client %s: %v, want the server's TLS alert, ErrRefused, not an outage", name, err)
			}
		}
		untrusting := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, MaxRetries: -1})
		defer untrusting.Close()
		if err := untrusting.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a client that does not trust the CA: %v, want a certificate error", err)
		}
		plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Error("a client without TLS was answered")
		}
	})
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
	addr, files := testkit.StartRedisTLS(t, true)
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
		// write: a server of the test's own stands in for it there (it
		// asks for a certificate, and resets a client that gave none).
		r := newResetter(t, addr, files)
		claims(t, redis.Options{Addr: r.addr(), TLSConfig: files.ClientConfig(t, false)}, 20)
		if r.resets.Load() == 0 {
			t.Fatal("no connection was reset")
		}
	})
	t.Logf("refusals: %v", kinds)
}

// resetter forwards its first connection to a server, and completes the
// TLS handshake of every later one as a server asking for a client
// certificate, reads the client's first write and resets the
// connection.
type resetter struct {
	ln     net.Listener
	resets atomic.Int64
	wg     sync.WaitGroup
}

func newResetter(t *testing.T, target string, files *testkit.TLSFiles) *resetter {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &resetter{ln: ln}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS13}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				if first {
					forward(c, target)
					return
				}
				tc := tls.Server(c, cfg)
				if tc.Handshake() == nil && len(tc.ConnectionState().PeerCertificates) == 0 {
					_, _ = tc.Read(make([]byte, 1))
					r.resets.Add(1)
				}
				_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		r.wg.Wait()
	})
	return r
}

func (r *resetter) addr() string { return r.ln.Addr().String() }

// forward copies c to and from a connection to target until either
// side closes.
func forward(c net.Conn, target string) {
	defer c.Close()
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(s, c)
		_ = s.Close()
		close(done)
	}()
	_, _ = io.Copy(c, s)
	_ = c.Close()
	<-done
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
