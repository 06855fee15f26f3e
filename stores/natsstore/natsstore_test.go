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

// The conformance suite and the model run on both servers (onServers):
// the shared one, whose buckets expire records by their MaxAge, and one
// of the current release, where each record has a TTL of its own.

func TestConformance(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		storetest.Run(t, factory(nc, natsstore.Config{MaxLease: suiteMax, MaxRetention: suiteMax}), storetest.AdminNoScopes())
	})
}

// TestConformanceShards runs the suite with the records spread over
// three buckets: the keys of a claim then live in different streams.
func TestConformanceShards(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		storetest.Run(t, factory(nc, natsstore.Config{Shards: 3, MaxLease: suiteMax, MaxRetention: suiteMax}), storetest.AdminNoScopes())
	})
}

// TestConformanceBucketMode runs the suite on the current server with
// the buckets' MaxAge (TTLBucket), as a deployment whose buckets an
// older server created does after an upgrade.
func TestConformanceBucketMode(t *testing.T) {
	storetest.Run(t, factory(currentConn(t), natsstore.Config{TTLMode: natsstore.TTLBucket, MaxLease: suiteMax, MaxRetention: suiteMax}),
		storetest.AdminNoScopes())
}

// TestConformanceLeaderReads runs the suite reading from the stream
// leader (STREAM.MSG.GET), as the store does on a replicated bucket.
func TestConformanceLeaderReads(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		storetest.Run(t, leaderReads(nc, natsstore.Config{MaxLease: suiteMax, MaxRetention: suiteMax}), storetest.AdminNoScopes())
	})
}

// TestModelLeaderReads is TestModel reading from the stream leader.
func TestModelLeaderReads(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg, bound := modelConfig(nc, natsstore.Config{})
		storetest.RunModel(t, leaderReads(nc, cfg), bound)
	})
}

// leaderReads builds stores on nc with cfg that read from the stream
// leader.
func leaderReads(nc *nats.Conn, cfg natsstore.Config) storetest.Factory {
	return func(t *testing.T, clock stores.Clock) stores.Store {
		c := cfg
		c.Clock = clock
		s := newStore(t, nc, c)
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
	onServers(t, conformanceSystemClock)
}

func conformanceSystemClock(t *testing.T, nc *nats.Conn) {
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
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg, bound := modelConfig(nc, natsstore.Config{})
		storetest.RunModel(t, factory(nc, cfg), bound)
	})
}

// TestModelShards is TestModel over three buckets.
func TestModelShards(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg, bound := modelConfig(nc, natsstore.Config{Shards: 3})
		storetest.RunModel(t, factory(nc, cfg), bound)
	})
}

// modelConfig returns cfg with the model's bounds on leases and
// retentions, and the model's option that checks them. Under TTLBucket
// both are modelMax (the buckets' MaxAge); under TTLPerKey a retention
// is bounded by natsstore.MaxDurationLimit only, and so is a lease with
// MaxLease at that bound: the server then keeps records with TTLs of a
// century and more.
func modelConfig(nc *nats.Conn, cfg natsstore.Config) (natsstore.Config, storetest.Option) {
	if expectedMode(nc, cfg) == natsstore.TTLPerKey {
		cfg.MaxLease = natsstore.MaxDurationLimit
		return cfg, storetest.MaxDuration(natsstore.MaxDurationLimit)
	}
	cfg.MaxLease, cfg.MaxRetention = modelMax, modelMax
	return cfg, storetest.MaxDuration(modelMax)
}
