package sqlstore_test

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestConformance runs the suite on the servers with group commit on (the
// default) and off; internal/onstores/sqlstore runs it on SQLite.
func TestConformance(t *testing.T) {
	sqltest.Conformance(t, backends)
}

// noSQL is a driver that fails any use: a store built over it must not
// touch the database.
type noSQL struct{ t *testing.T }

func (d noSQL) Open(string) (driver.Conn, error) {
	d.t.Error("the driver was used")
	return nil, errors.New("no SQL allowed")
}

func TestHostileTableNames(t *testing.T) {
	sql.Register("sqlstore-nosql-"+t.Name(), noSQL{t})
	db, err := sql.Open("sqlstore-nosql-"+t.Name(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, name := range []string{
		"x; DROP TABLE y",
		"x;DROP TABLE y--",
		`x" ; DROP TABLE "y`,
		"x` ; DROP TABLE `y",
		"x'",
		"x y",
		"X",
		"Dedup",
		"1abc",
		"a.b.c",
		".x",
		"x.",
		"sch\u0435ma.x", // Cyrillic e
		"x\x00",
		"x-y",
		"x/*",
		strings.Repeat("a", 49),
	} {
		for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite} {
			cfg := sqlstore.Config{Dialect: d, Table: name}
			if err := cfg.Validate(); !errors.Is(err, sqlstore.ErrInvalidTable) {
				t.Errorf("Validate(%s, Table %q) = %v, want ErrInvalidTable", d, name, err)
			}
			if _, err := sqlstore.New(db, cfg); !errors.Is(err, sqlstore.ErrInvalidTable) {
				t.Errorf("New(%s, Table %q) = %v, want ErrInvalidTable", d, name, err)
			}
		}
	}
	// Schema-qualified names are fine on the servers, not on SQLite.
	if err := (sqlstore.Config{Dialect: sqlstore.Postgres, Table: "inbox.dedup"}).Validate(); err != nil {
		t.Errorf("schema.table on PostgreSQL: %v", err)
	}
	if err := (sqlstore.Config{Dialect: sqlstore.SQLite, Table: "main.dedup"}).Validate(); !errors.Is(err, sqlstore.ErrInvalidTable) {
		t.Errorf("schema.table on SQLite: %v, want ErrInvalidTable", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  sqlstore.Config
		want string
	}{
		{sqlstore.Config{Dialect: "oracle"}, "Dialect"},
		{sqlstore.Config{PurgeInterval: -1}, "PurgeInterval"},
		{sqlstore.Config{PurgeBatch: -1}, "PurgeBatch"},
		{sqlstore.Config{PurgeBatch: sqlstore.MaxPurgeBatch + 1}, "100000"},
		{sqlstore.Config{PurgeGrace: -time.Second}, "PurgeGrace"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := (sqlstore.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

// TestInboxConformance runs the Inbox conformance suite on the servers:
// Begin in its own transaction, and joined to a caller's transaction
// (sqlstore.WithTx). On PostgreSQL the joined transaction is ended by a
// failed statement, on MySQL/MariaDB by a lost deadlock.
// internal/onstores/sqlstore runs it on SQLite.
func TestInboxConformance(t *testing.T) {
	sqltest.InboxConformance(t, backends)
}

// TestPartitionedInboxConformance runs the Inbox suite on the PostgreSQL
// daily-partitioned layout, whose Begin takes advisory locks.
func TestPartitionedInboxConformance(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
		return sqltest.NewInboxFixture(t, db, sqlstore.Postgres, partitionedConfig(clock))
	})
}

// TestModel checks the store against the model of the Store contract on
// the servers (sqltest.Model); internal/onstores/sqlstore runs it on
// SQLite.
func TestModel(t *testing.T) {
	sqltest.Model(t, backends)
}

// TestModelPartitioned checks the daily-partitioned layout against the
// model: leases and retentions longer than PartitionDaysAhead are
// refused, and the fake clock stays within the partitions CreateSchema
// made (from the day before to PartitionDaysAhead days after its start).
func TestModelPartitioned(t *testing.T) {
	db := sqltest.OpenPostgres(t)
	days := time.Duration(sqlstore.DefaultPartitionDaysAhead) * 24 * time.Hour
	storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
		cfg := partitionedConfig(clock)
		cfg.PurgeGrace = sqltest.ModelPurgeGrace
		return sqltest.NewStore(t, db, sqlstore.Postgres, cfg)
	}, storetest.Precision(time.Microsecond), storetest.Maintenance(sqltest.PurgeStore),
		storetest.MaxDuration(days), storetest.MaxElapsed(12*time.Hour))
}
