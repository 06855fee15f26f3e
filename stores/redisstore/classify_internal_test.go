package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
)

// replyError is a Redis error reply, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// TestClassifyServerReplies: the error replies of a server that cannot
// serve now are outages; the others are not.
func TestClassifyServerReplies(t *testing.T) {
	classify := (&Store{}).classify
	outages := []string{
		"LOADING Redis is loading the dataset in memory",
		"READONLY You can't write against a read only replica.",
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
		"CLUSTERDOWN The cluster is down",
		"TRYAGAIN Multiple keys request during rehashing of slot",
		"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
		"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
		"ERR max number of clients reached",
		"NOREPLICAS Not enough good replicas to write.",
	}
	for _, msg := range outages {
		if err := classify(fmt.Errorf("evalsha: %w", replyError(msg))); !errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("classify(%q) = %v, want an outage", msg, err)
		}
	}
	for _, msg := range []string{
		"ERR Error running script (call to f_x): @user_script:1: user_script:1: Script attempted to access a non local key in a cluster node",
		"WRONGTYPE Operation against a key holding the wrong kind of value",
		"NOSCRIPT No matching script. Please use EVAL.",
		"CROSSSLOT Keys in request don't hash to the same slot",
		"OOM command not allowed when used memory > 'maxmemory'.",
		"NOAUTH Authentication required.",
		"NOPERM this user has no permissions to run the 'evalsha' command",
	} {
		if err := classify(replyError(msg)); errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("classify(%q) = %v, want no outage", msg, err)
		}
	}
	if err := classify(redis.ErrClosed); errors.Is(err, stores.ErrUnavailable) {
		t.Errorf("a client closed by its owner is not an outage: %v", err)
	}
}

func TestMSRoundsUpWithoutOverflow(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2},
		{time.Hour, 3_600_000}, {math.MaxInt64, 9_223_372_036_855}, {math.MaxInt64 - 1, 9_223_372_036_855},
	} {
		if got := ms(c.d); got != c.want {
			t.Errorf("ms(%d) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestClassifyConnectionErrors: an error is an outage only when it is
// known to be one. A dial refused or timed out, a timeout, an
// unreachable network are; a reset or an EOF is only from a server that
// has answered the store and not refused it since (a server that turns
// a client away closes its connection too); a TLS alert, a name that
// does not resolve, a connection the client closed never are.
func TestClassifyConnectionErrors(t *testing.T) {
	op := func(o string, err error) error {
		return &net.OpError{Op: o, Net: "tcp", Err: err}
	}
	reset := op("write", os.NewSyscallError("write", syscall.ECONNRESET))
	readReset := op("read", os.NewSyscallError("read", syscall.ECONNRESET))
	alert := op("remote error", errors.New("tls: certificate required"))
	always := []error{
		op("dial", os.NewSyscallError("connect", syscall.ECONNREFUSED)),
		op("dial", os.NewSyscallError("connect", syscall.EHOSTUNREACH)),
		op("dial", &net.DNSError{Err: "i/o timeout", Name: "redis", IsTimeout: true}),
		op("read", os.ErrDeadlineExceeded),
		op("write", os.NewSyscallError("write", syscall.ENETUNREACH)),
		redis.ErrPoolTimeout,
	}
	never := []error{
		op("local error", errors.New("tls: bad record MAC")),
		op("dial", &net.DNSError{Err: "no such host", Name: "redis", IsNotFound: true}),
		net.ErrClosed,
		redis.ErrClosed,
		context.DeadlineExceeded,
	}
	known := []error{reset, readReset, io.EOF, io.ErrUnexpectedEOF, op("write", os.NewSyscallError("write", syscall.EPIPE))}

	s := &Store{}
	check := func(when string, err error, want bool) {
		t.Helper()
		if got := errors.Is(s.classify(fmt.Errorf("evalsha: %w", err)), stores.ErrUnavailable); got != want {
			t.Errorf("%s: classify(%v) is an outage: %v, want %v", when, err, got, want)
		}
	}
	all := func(when string, want bool) {
		t.Helper()
		for _, err := range always {
			check(when, err, true)
		}
		for _, err := range never {
			check(when, err, false)
		}
		for _, err := range known {
			check(when, err, want)
		}
	}
	all("before any answer", false)
	check("before any answer", alert, false)
	s.heard(replyError("NOPERM no"))
	all("after an answer", true)
	check("after an answer", alert, false) // a refusal, remembered
	all("after a TLS alert", false)
	s.heard(redis.Nil)
	all("after an answer again", true)
}
