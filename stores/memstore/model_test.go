package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// sweep is the store's housekeeping for the model: it may forget only
// what the contract lets it forget.
func sweep(_ context.Context, s stores.Store) error {
	s.(*memstore.Store).Sweep()
	return nil
}

// TestModel checks the store against the model of the Store contract,
// to the nanosecond on a fake clock, with Sweep run between calls.
func TestModel(t *testing.T) {
	storetest.RunModel(t, newStore, storetest.Maintenance(sweep))
}

// TestModelOneShard runs the model with every key in one shard, where
// the keys of a multi-key claim share a lock and a table.
func TestModelOneShard(t *testing.T) {
	storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
		s, err := memstore.New(memstore.Config{Clock: clock, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}, storetest.Maintenance(sweep))
}

// TestModelSystemClock runs the model in real time on the system clock,
// which the store reads as monotonic time.
func TestModelSystemClock(t *testing.T) {
	storetest.RunModel(t, newStore, storetest.RealTime(50*time.Millisecond), storetest.Maintenance(sweep))
}
