package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// modelPurgeGrace is the PurgeGrace of the stores the model checks:
// longer than any finite lease the model gives but its few hour-long
// ones, so that Purge, run between calls, may forget an expired claim
// only when the contract lets it.
const modelPurgeGrace = 24 * time.Hour

// purge is the store's housekeeping for the model.
func purge(ctx context.Context, s stores.Store) error {
	_, err := s.(*sqlstore.Store).Purge(ctx)
	return err
}

// TestModel checks the store against the model of the Store contract on
// every dialect, with group commit on (the default) and off. Time is the
// fake clock's, truncated to the microsecond; Purge runs between calls.
func TestModel(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		for _, off := range []bool{false, true} {
			name := "batched"
			if off {
				name = "unbatched"
			}
			t.Run(name, func(t *testing.T) {
				storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
					return newStore(t, b.open(t), b.dialect, sqlstore.Config{
						Clock:      clock,
						Batch:      sqlstore.BatchConfig{Disabled: off},
						PurgeGrace: modelPurgeGrace,
					})
				}, storetest.Precision(time.Microsecond), storetest.Maintenance(purge))
			})
		}
	})
}

// TestModelPartitioned checks the daily-partitioned layout against the
// model: leases and retentions longer than PartitionDaysAhead are
// refused, and the fake clock stays within the partitions CreateSchema
// made (from the day before to PartitionDaysAhead days after its start).
func TestModelPartitioned(t *testing.T) {
	db := openPostgres(t)
	days := time.Duration(sqlstore.DefaultPartitionDaysAhead) * 24 * time.Hour
	storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
		cfg := partitionedConfig(clock)
		cfg.PurgeGrace = modelPurgeGrace
		return newStore(t, db, sqlstore.Postgres, cfg)
	}, storetest.Precision(time.Microsecond), storetest.Maintenance(purge),
		storetest.MaxDuration(days), storetest.MaxElapsed(12*time.Hour))
}
