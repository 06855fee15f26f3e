package sqlstore_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestMaxDataConfig: Config.MaxData lowers Capabilities().MaxData, and
// may not exceed the dialect's.
func TestMaxDataConfig(t *testing.T) {
	db := openSQLite(t)
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{MaxData: 100})
	if got := s.Capabilities().MaxData; got != 100 {
		t.Fatalf("MaxData = %d, want 100", got)
	}
	sqltest.MaxDataRoundTrip(t, s, "k", 100)
	for _, c := range []sqlstore.Config{
		{Dialect: sqlstore.SQLite, MaxData: sqlstore.MaxDataSQLite + 1},
		{Dialect: sqlstore.MySQL, MaxData: sqlstore.MaxDataMySQL + 1},
		{Dialect: sqlstore.Postgres, MaxData: sqlstore.MaxDataPostgres + 1},
		{MaxData: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted MaxData %d", c, c.MaxData)
		}
	}
}
