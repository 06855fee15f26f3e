package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestConformance runs the suite on every dialect with group commit on
// (the default) and off.
func TestConformance(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		for _, off := range []bool{false, true} {
			name := "batched"
			if off {
				name = "unbatched"
			}
			t.Run(name, func(t *testing.T) {
				storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
					return newStore(t, b.open(t), b.dialect, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{Disabled: off}})
				}, storetest.AdminNoScopes())
			})
		}
	})
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

func TestDetectDialect(t *testing.T) {
	for _, b := range backends {
		var db *sql.DB
		switch b.dialect {
		case sqlstore.SQLite:
			db = openSQLite(t)
		default:
			// sql.Open does not connect: no server needed.
			var err error
			driverName := map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.MySQL: "mysql"}[b.dialect]
			db, err = sql.Open(driverName, "")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
		}
		d, err := sqlstore.DetectDialect(db)
		if err != nil || d != b.dialect {
			t.Errorf("DetectDialect = %q, %v; want %q", d, err, b.dialect)
		}
	}
}

func TestNeverClosesDB(t *testing.T) {
	db := openSQLite(t)
	s := newStore(t, db, sqlstore.SQLite, sqlstore.Config{PurgeInterval: time.Millisecond})
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("db unusable after Close: %v", err)
	}
	if _, err := s.Begin(context.Background(), "s", []string{"k"}, time.Hour); !errors.Is(err, stores.ErrClosed) {
		t.Fatalf("Begin after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Purge(context.Background()); !errors.Is(err, stores.ErrClosed) {
		t.Fatalf("Purge after Close = %v, want ErrClosed", err)
	}
}
