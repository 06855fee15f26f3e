package testkit

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy a test owns, placed between a client and a shared
// service so the test can simulate an outage without touching the service:
// Cut closes every connection and refuses new ones, Blackhole keeps
// connections open but lets no byte through (a partition, a hung server),
// Restore lets them through again.
type Proxy struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	hole  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	done  chan struct{}
}

// NewProxy listens on a free loopback port and forwards to target. It is
// closed by t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, to give the client instead of the
// service's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
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
// eventually does after a partition.
func (p *Proxy) Restore() {
	p.mu.Lock()
	if p.hole {
		for c := range p.conns {
			_ = c.Close()
		}
	}
	p.cut, p.hole = false, false
	p.mu.Unlock()
}

func (p *Proxy) holed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	select {
	case <-p.done:
		return
	default:
		close(p.done)
	}
	_ = p.ln.Close()
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

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
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

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.untrack(dst)
	p.untrack(src)
}
