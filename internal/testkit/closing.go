package testkit

import (
	"net"
	"testing"
)

// Closing listens on a loopback port of its own and closes every
// connection it accepts at once: with a reset (SO_LINGER 0) when reset,
// else with an EOF. It is how a server, or a balancer in front of a dead
// one, turns a client away. It returns the address; the listener stops
// when t ends.
func Closing(t testing.TB, reset bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if reset {
				_ = c.(*net.TCPConn).SetLinger(0)
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String()
}
