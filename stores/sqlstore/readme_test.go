package sqlstore_test

import (
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestREADMESchema keeps README.md's DDL identical to what CreateSchema
// runs, so a DBA applying the README gets the same table.
func TestREADMESchema(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	db := &sql.DB{} // New does no I/O
	for _, cfg := range []sqlstore.Config{
		{Dialect: sqlstore.Postgres},
		{Dialect: sqlstore.Postgres, DailyPartitions: true, PurgeInterval: time.Hour},
		{Dialect: sqlstore.MySQL},
		{Dialect: sqlstore.SQLite},
	} {
		s, err := sqlstore.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range s.SchemaStatements() {
			if !strings.Contains(string(readme), stmt+";") {
				t.Errorf("README.md lacks the %s DDL (partitioned %v):\n%s;", cfg.Dialect, cfg.DailyPartitions, stmt)
			}
		}
		_ = s.Close(t.Context())
	}
}
