package sqlstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// Every limit the configuration documents is inclusive: its largest
// allowed value is valid, and one more is not.
func TestConfigLimitsInclusive(t *testing.T) {
	table48 := strings.Repeat("t", 48)
	schema63 := strings.Repeat("s", 63)
	for _, tc := range []struct {
		name      string
		ok, wrong sqlstore.Config
	}{
		{"table of 48 bytes", sqlstore.Config{Dialect: sqlstore.Postgres, Table: table48}, sqlstore.Config{Dialect: sqlstore.Postgres, Table: table48 + "t"}},
		{"schema of 63 bytes", sqlstore.Config{Dialect: sqlstore.Postgres, Table: schema63 + ".dedup"}, sqlstore.Config{Dialect: sqlstore.Postgres, Table: schema63 + "s.dedup"}},
		{"PurgeBatch", sqlstore.Config{PurgeBatch: sqlstore.MaxPurgeBatch}, sqlstore.Config{PurgeBatch: sqlstore.MaxPurgeBatch + 1}},
		{"PartitionDaysAhead", sqlstore.Config{PartitionDaysAhead: 366}, sqlstore.Config{PartitionDaysAhead: 367}},
		{"Batch.MaxBatch", sqlstore.Config{Batch: sqlstore.BatchConfig{MaxBatch: sqlstore.MaxBatchLimit}}, sqlstore.Config{Batch: sqlstore.BatchConfig{MaxBatch: sqlstore.MaxBatchLimit + 1}}},
		{"Batch.MaxInFlight", sqlstore.Config{Batch: sqlstore.BatchConfig{MaxInFlight: sqlstore.MaxInFlightLimit}}, sqlstore.Config{Batch: sqlstore.BatchConfig{MaxInFlight: sqlstore.MaxInFlightLimit + 1}}},
		{"DailyPartitions PurgeInterval", sqlstore.Config{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeInterval: 24 * time.Hour}, sqlstore.Config{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeInterval: 24*time.Hour + 1}},
	} {
		if err := tc.ok.Validate(); err != nil {
			t.Errorf("%s: the largest allowed value refused: %v", tc.name, err)
		}
		if err := tc.wrong.Validate(); err == nil {
			t.Errorf("%s: one past the limit accepted", tc.name)
		}
	}
}
