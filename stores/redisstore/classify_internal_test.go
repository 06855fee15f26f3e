package redisstore

import (
	"errors"
	"fmt"
	"math"
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
