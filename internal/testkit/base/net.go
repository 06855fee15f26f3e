package base

import (
	"net"
	"sync"
	"testing"
)

// ClosedAddr returns a loopback host:port nothing listens on: a service
// that is down, for a test of what a client says then.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// Closing listens on a loopback port of its own and closes every
// connection it accepts at once: with a reset (SO_LINGER 0) when reset,
// else with an EOF. It is how a server, or a balancer in front of a dead
// one, turns a client away. It returns the address; the listener stops
// when t ends.
func Closing(t testing.TB, reset bool) string {
	t.Helper()
	return Serve(t, func(c net.Conn) {
		if reset {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
	})
}

// Serve listens on a loopback port of its own and serves each connection
// it accepts with serve, in a goroutine of its own, then closes it. It
// returns the address; the listener stops, and Serve waits for every
// serve to return, when t ends.
func Serve(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
