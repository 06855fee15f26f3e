package testkit

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy a test owns, placed between a client and a shared
// service so the test can simulate an outage without touching the service:
// Cut closes every connection and stops listening (a service that is down:
// a dial is refused), Blackhole keeps connections open but lets no byte
// through (a partition, a hung server), Restore lets them through again.
// SetLatency makes it slow instead: every byte arrives, late.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu      sync.Mutex
	ln      net.Listener // nil while cut
	cut     bool
	hole    bool
	latency time.Duration
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	done    chan struct{}
}

// NewProxy listens on a free loopback port and forwards to target. It is
// closed by t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{t: t, target: target, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept(ln)
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, to give the client instead of the
// service's.
func (p *Proxy) Addr() string { return p.addr }

// Cut closes every open connection and stops listening until Restore: a
// new connection is refused (ECONNREFUSED), as by a host whose service is
// down, not accepted and closed (what a load balancer in front of a dead
// service does, which a client cannot tell from a server turning it away).
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Blackhole keeps every connection open, and accepts new ones, but drops
// every byte in both directions until Restore: calls hang until their
// deadlines.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.hole = true
	p.mu.Unlock()
}

// Restore lets connections through again. After a Blackhole it first
// closes the connections that lost bytes, as a peer's TCP stack
// eventually does after a partition; after a Cut it listens again on the
// same address (a port taken meanwhile by another socket fails the test).
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole {
		for c := range p.conns {
			_ = c.Close()
		}
	}
	if p.cut {
		select {
		case <-p.done:
		default:
			ln, err := listenAgain(p.addr)
			if err != nil {
				p.t.Errorf("proxy: listening again on %s after Cut: %v", p.addr, err)
				return
			}
			p.ln = ln
			p.wg.Add(1)
			go p.accept(ln)
		}
	}
	p.cut, p.hole = false, false
}

// listenAgain listens on addr, a port the proxy listened on before: tried
// for a while, should the port be in use by a socket of the moment.
func listenAgain(addr string) (net.Listener, error) {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ln, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return ln, err
		}
	}
}

// SetLatency delays every byte by d in each direction, from when the
// proxy reads it to when it forwards it, in order and without dropping
// any, until SetLatency(0): a slow service (or network), not a failed one.
// A call through the proxy takes at least 2d longer; a client that gives
// up on it meanwhile still has its request delivered, and the service
// acts on it. Bytes read before SetLatency(0) keep their delay.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

func (p *Proxy) holed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
		close(p.done)
	}
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		client, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !p.track(client) {
			_ = client.Close()
			continue
		}
		if p.holed() {
			// Never answered: read and drop until closed.
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				_, _ = io.Copy(io.Discard, client)
				p.untrack(client)
			}()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil || !p.track(server) {
			if server != nil {
				_ = server.Close()
			}
			p.untrack(client)
			continue
		}
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// chunk is what the proxy read from one side, due on the other at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe reads src and hands what it reads, stamped with its due time, to
// forward, which writes it to dst in order. When src ends, forward writes
// what is left (at its time) and closes both sides.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	q := make(chan chunk, 64)
	stop := make(chan struct{}) // forward has given up: dst is gone
	p.wg.Add(1)
	go p.forward(dst, src, q, stop)
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed() {
			c := chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.delay())}
			select {
			case q <- c:
			case <-stop:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forward(dst, src net.Conn, q <-chan chunk, stop chan<- struct{}) {
	defer p.wg.Done()
	defer func() {
		close(stop)
		p.untrack(dst)
		p.untrack(src)
	}()
	for c := range q {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}
