package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ageScript makes KEYS[1] ARGV[1] ms older: its remaining TTL shrinks by
// that much, and a key whose TTL would reach zero is deleted, as the
// server would have deleted it. A key without a TTL, or none, is left
// alone. Reply: the key's remaining TTL in ms afterwards (-2: no key).
var ageScript = redis.NewScript(`
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then
  return pttl
end
local left = pttl - tonumber(ARGV[1])
if left > 0 then
  redis.call('PEXPIRE', KEYS[1], left)
  return left
end
redis.call('DEL', KEYS[1])
return -2
`)

// age lets d pass for the records of rkeys, as far as the store can
// tell: the store keeps no time of its own but each record's TTL (a
// lease is live while PTTL > lease, a done record lives until its TTL
// runs out, an undo puts back what was left of a TTL), so shrinking
// every TTL by d is d passing on the server's clock. Tests use leases
// of minutes or hours, which run out only when a test ages the record
// past them, never because the machine was slow. One call per key, so
// that Redis Cluster sees no CROSSSLOT.
func age(t testing.TB, c redis.UniversalClient, d time.Duration, rkeys ...string) {
	t.Helper()
	ms := strconv.FormatInt(d.Milliseconds(), 10)
	for _, k := range rkeys {
		if err := ageScript.Run(context.Background(), c, []string{k}, ms).Err(); err != nil {
			t.Fatalf("ageing %q by %s: %v", k, d, err)
		}
	}
}

// deadlineCtx is a context whose deadline passes when the test calls
// expire, not when a clock says so: a test of what a call does when its
// deadline passes at a given point (queued, or out in a pipeline) gets
// there by events, however slow the machine. Deadline reports an hour
// from its making, for the code that reads it (a batch runs under the
// latest deadline of its calls).
type deadlineCtx struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

func newDeadlineCtx() *deadlineCtx {
	return &deadlineCtx{Context: context.Background(), at: time.Now().Add(time.Hour), done: make(chan struct{})}
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.done }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// expire makes the deadline pass now.
func (c *deadlineCtx) expire() { c.once.Do(func() { close(c.done) }) }
