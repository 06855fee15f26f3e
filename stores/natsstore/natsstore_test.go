package natsstore_test

import (
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// modelMax is the MaxLease and MaxRetention of the model's stores: the
// bound storetest.MaxDuration checks.
const modelMax = 24 * time.Hour

func TestConformance(t *testing.T) {
	storetest.Run(t, factory(sharedConn(t), natsstore.Config{}))
}

// TestConformanceShards runs the suite with the records spread over
// three buckets: the keys of a claim then live in different streams.
func TestConformanceShards(t *testing.T) {
	storetest.Run(t, factory(sharedConn(t), natsstore.Config{Shards: 3}))
}

// TestConformanceLeaderReads runs the suite reading from the stream
// leader (STREAM.MSG.GET), as the store does on a replicated bucket.
func TestConformanceLeaderReads(t *testing.T) {
	nc := sharedConn(t)
	storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
		s := newStore(t, nc, natsstore.Config{Clock: clock})
		s.SetLeaderReads(true)
		return s
	})
}

// TestModelLeaderReads is TestModel reading from the stream leader.
func TestModelLeaderReads(t *testing.T) {
	nc := sharedConn(t)
	storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
		s := newStore(t, nc, natsstore.Config{MaxLease: modelMax, MaxRetention: modelMax, Clock: clock})
		s.SetLeaderReads(true)
		return s
	}, storetest.MaxDuration(modelMax))
}

// TestConformanceSystemClock runs the suite on the wall clock, sleeping
// for leases and retentions to pass.
func TestConformanceSystemClock(t *testing.T) {
	storetest.Run(t, factory(sharedConn(t), natsstore.Config{}), storetest.RealTime(250*time.Millisecond))
}

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
