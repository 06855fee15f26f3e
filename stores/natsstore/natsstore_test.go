package natsstore_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// modelMax is the MaxLease and MaxRetention of the model's stores: the
// bound storetest.MaxDuration checks.
const modelMax = 24 * time.Hour

// suiteMax is the MaxLease and MaxRetention of the conformance suite's
// stores: the admin tests hold records for a week of the fake clock
// (and past two days of purge), 20 hours of the system clock moved.
const suiteMax = 9 * 24 * time.Hour

func TestConformance(t *testing.T) {
	storetest.Run(t, factory(sharedConn(t), natsstore.Config{MaxLease: suiteMax, MaxRetention: suiteMax}), storetest.AdminNoScopes())
}

// TestConformanceShards runs the suite with the records spread over
// three buckets: the keys of a claim then live in different streams.
func TestConformanceShards(t *testing.T) {
	storetest.Run(t, factory(sharedConn(t), natsstore.Config{Shards: 3, MaxLease: suiteMax, MaxRetention: suiteMax}), storetest.AdminNoScopes())
}

// TestConformanceLeaderReads runs the suite reading from the stream
// leader (STREAM.MSG.GET), as the store does on a replicated bucket.
func TestConformanceLeaderReads(t *testing.T) {
	storetest.Run(t, leaderReads(sharedConn(t), suiteMax), storetest.AdminNoScopes())
}

// TestModelLeaderReads is TestModel reading from the stream leader.
func TestModelLeaderReads(t *testing.T) {
	storetest.RunModel(t, leaderReads(sharedConn(t), modelMax), storetest.MaxDuration(modelMax))
}

// leaderReads builds stores on nc that read from the stream leader, with
// d as MaxLease and MaxRetention.
func leaderReads(nc *nats.Conn, d time.Duration) storetest.Factory {
	return func(t *testing.T, clock stores.Clock) stores.Store {
		s := newStore(t, nc, natsstore.Config{MaxLease: d, MaxRetention: d, Clock: clock})
		s.SetLeaderReads(true)
		return s
	}
}

// TestConformanceSystemClock runs the suite on the system clock: the
// store reads time.Now (readings with a monotonic part, real time passing
// between and during calls), moved forward when the suite moves time
// (storetest.ServerTime) instead of the suite sleeping through sub-second
// leases, which a slow machine could make run out before it checked them.
func TestConformanceSystemClock(t *testing.T) {
	nc := sharedConn(t)
	var clocks sync.Map // stores.Store -> *movedClock
	storetest.Run(t, func(t *testing.T, _ stores.Clock) stores.Store {
		c := &movedClock{}
		s := newStore(t, nc, natsstore.Config{MaxLease: suiteMax, MaxRetention: suiteMax, Clock: c})
		clocks.Store(stores.Store(s), c)
		return s
	}, storetest.ServerTime(func(t testing.TB, s stores.Store, d time.Duration) {
		c, ok := clocks.Load(s)
		if !ok {
			t.Fatalf("no clock for store %p", s)
		}
		c.(*movedClock).advance(d)
	}), storetest.AdminNoScopes())
}

// movedClock is the system clock, moved forward by advance.
type movedClock struct{ offset atomic.Int64 }

func (c *movedClock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *movedClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// TestModel checks the store against the model of the Store contract,
// to the nanosecond on a fake clock.
func TestModel(t *testing.T) {
	storetest.RunModel(t, factory(sharedConn(t), natsstore.Config{MaxLease: modelMax, MaxRetention: modelMax}),
		storetest.MaxDuration(modelMax))
}

// TestModelShards is TestModel over three buckets.
func TestModelShards(t *testing.T) {
	storetest.RunModel(t, factory(sharedConn(t), natsstore.Config{MaxLease: modelMax, MaxRetention: modelMax, Shards: 3}),
		storetest.MaxDuration(modelMax))
}
