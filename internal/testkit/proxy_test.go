package testkit

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/base"
)

// echoServer echoes every connection back, and sends what each
// connection brought, once it ends, on got.
func echoServer(t *testing.T) (addr string, got <-chan []byte) {
	t.Helper()
	ch := make(chan []byte, 16)
	addr = base.Serve(t, func(c net.Conn) {
		var all bytes.Buffer
		_, _ = io.Copy(io.MultiWriter(c, &all), c)
		ch <- all.Bytes()
	})
	return addr, ch
}

// TestProxyLatency: bytes arrive in order, each at least the latency
// late in each direction, and SetLatency(0) makes the proxy fast again.
func TestProxyLatency(t *testing.T) {
	addr, _ := echoServer(t)
	p := NewProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string) time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if string(buf) != msg {
			t.Fatalf("echo %q, want %q", buf, msg)
		}
		return time.Since(start)
	}
	roundTrip("warm")
	const d = 150 * time.Millisecond
	p.SetLatency(d)
	if rt := roundTrip("slow one"); rt < 2*d {
		t.Errorf("round trip through a proxy with %s of latency took %s, want at least %s", d, rt, 2*d)
	}
	// Several writes in a row keep their order.
	want := ""
	for _, part := range []string{"a", "bb", "ccc", "dddd"} {
		if _, err := c.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		want += part
	}
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != want {
		t.Errorf("got %q, want %q in order", buf, want)
	}
	p.SetLatency(0)
	roundTrip("fast again")
}

// TestProxyLatencyDeliversAfterTheClientLeft: a client that gives up and
// closes its connection before its delayed bytes went through still has
// them delivered, as a slow service still acts on a request whose client
// timed out.
func TestProxyLatencyDeliversAfterTheClientLeft(t *testing.T) {
	addr, got := echoServer(t)
	p := NewProxy(t, addr)
	p.SetLatency(100 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("SET k v")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	select {
	case b := <-got:
		if string(b) != "SET k v" {
			t.Errorf("the service got %q, want %q", b, "SET k v")
		}
	case <-time.After(time.Minute):
		t.Fatal("the service never saw the request of the client that left")
	}
}

// TestProxyCut: Cut closes the connections through the proxy and stops
// listening, so a new connection is refused (not accepted and closed);
// Restore listens again on the same address and forwards again.
func TestProxyCut(t *testing.T) {
	addr, _ := echoServer(t)
	p := NewProxy(t, addr)
	echo := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		_, err = io.ReadFull(c, buf)
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	p.Cut()
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection open at the cut: %v, want it closed", err)
	}
	if err := echo(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a dial during the cut: %v, want ECONNREFUSED", err)
	}
	p.Restore()
	if err := echo(); err != nil {
		t.Fatalf("through the proxy after Restore: %v", err)
	}
}
