package testkit

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePort returns a loopback port that is free, as is port+10000 (the
// cluster bus port).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePortPair is FreePort for a program.
func FreePortPair() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(10000)
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		_ = l1.Close()
		if err != nil {
			continue
		}
		_ = l2.Close()
		return p, nil
	}
	return 0, errors.New("no free loopback port pair found")
}
