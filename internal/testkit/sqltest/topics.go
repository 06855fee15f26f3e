package sqltest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// OpenSQL opens the shared test database, PostgreSQL through pgx or, with
// mysql, MySQL (the caller imports the driver), with four connections at
// most, closed when t ends, and returns it with its DSN.
func OpenSQL(t testing.TB, mysql bool) (db *sql.DB, dsn string) {
	t.Helper()
	driver, dsn := "pgx", testkit.RequirePostgres(t)
	if mysql {
		driver, dsn = "mysql", testkit.RequireMySQL(t)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		testkit.Unavailable(t, driver, dsn, err)
	}
	return db, dsn
}

// InitializeTopic fails t on err, the error of making sub, a subscriber
// of any watermill-sql major on db, then creates topic's tables with sub
// (the router closes it) and drops tables (quoted) when t ends.
func InitializeTopic(t testing.TB, db *sql.DB, mysql bool, sub interface{ SubscribeInitialize(string) error }, err error, topic string, tables ...string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	d := sqlstore.Postgres
	if mysql {
		d = sqlstore.MySQL
	}
	t.Cleanup(func() {
		if err := DropTables(context.Background(), db, d, tables...); err != nil {
			t.Error(err)
		}
	})
}
