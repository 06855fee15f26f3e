package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestDialTimeoutIsAnOutage: a server that takes no new connection (its
// listen queue full: the SYN goes unanswered) times the dial out, a
// known outage, although net's dial timeout is also
// context.DeadlineExceeded, the caller's own class when its context
// ended: here it has not.
func TestDialTimeoutIsAnOutage(t *testing.T) {
	addr := fullListener(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Config{Prefix: "dedup-test-dial-timeout:"})
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := s.Claim(ctx, "s", []string{"k" + strconv.Itoa(i)}, time.Minute)
		cancel()
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("claim %d: %v, want a dial timeout", i, err)
		}
		if !errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("claim %d: %v, want an outage", i, err)
		}
	}
}

// fullListener returns the address of a loopback socket that listens
// with a backlog of 0 and never accepts, its one place taken: a new
// connection's SYN goes unanswered.
func fullListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
	// Take the one place, and check that the next dial times out.
	first, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("a dial to a full listen queue: %v, want a timeout", err)
			}
			return addr
		}
		// Taken before the queue was seen full: one more.
		t.Cleanup(func() { _ = c.Close() })
	}
}
