package sqlstore_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

func TestDetectDialect(t *testing.T) {
	for _, b := range backends {
		var db *sql.DB
		switch b.Dialect {
		case sqlstore.SQLite:
			db = openSQLite(t)
		default:
			// sql.Open does not connect: no server needed.
			var err error
			driverName := map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.MySQL: "mysql"}[b.Dialect]
			db, err = sql.Open(driverName, "")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
		}
		d, err := sqlstore.DetectDialect(db)
		if err != nil || d != b.Dialect {
			t.Errorf("DetectDialect = %q, %v; want %q", d, err, b.Dialect)
		}
	}
}

func TestNeverClosesDB(t *testing.T) {
	db := openSQLite(t)
	s := sqltest.NewStore(t, db, sqlstore.SQLite, sqlstore.Config{PurgeInterval: time.Millisecond})
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

// TestAdminRecordID: the ID the admin interface reports is RecordID as a
// UUID, the id column of the table; a List cursor takes it with or
// without dashes; and every dialect reports the table's size.
func TestAdminRecordID(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		ctx := context.Background()
		s := sqltest.NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{})
		c, err := s.Claim(ctx, "orders", []string{"k"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		r, err := s.Get(ctx, "orders", "k")
		if err != nil {
			t.Fatal(err)
		}
		id := sqlstore.RecordID("orders", "k")
		h := hex.EncodeToString(id[:])
		if want := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]; r.ID != want {
			t.Fatalf("ID = %q, want RecordID %q", r.ID, want)
		}
		for _, after := range []string{r.ID, h} {
			recs, next, err := s.List(ctx, stores.ListOptions{After: after})
			if err != nil || len(recs) != 0 || next != "" {
				t.Fatalf("List after the only record (%q) = %+v, %q, %v", after, recs, next, err)
			}
		}
		_, _, err = s.List(ctx, stores.ListOptions{Scope: "orders"})
		if !errors.Is(err, stores.ErrNotSupported) {
			t.Fatalf("List by scope = %v, want ErrNotSupported", err)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Processing != 1 || st.Bytes <= 0 {
			t.Fatalf("Stats = %+v, want one processing record and the table's size", st)
		}
	})
}

// TestConformance runs the suite on SQLite with group commit on (the
// default) and off; stores/sqlstore runs it on the servers.
func TestConformance(t *testing.T) {
	sqltest.Conformance(t, sqliteBackends)
}

// TestInboxConformance runs the Inbox conformance suite on SQLite, which
// runs joined mode on one transaction at a time: BEGIN IMMEDIATE takes
// the database's write lock, so a second transaction waits in its own
// BEGIN, never in the store's Begin, and a statement that fails does not
// end the transaction. stores/sqlstore runs it on the servers.
func TestInboxConformance(t *testing.T) {
	sqltest.InboxConformance(t, sqliteBackends)
}

// TestModel checks the store against the model of the Store contract on
// SQLite; stores/sqlstore runs it on the servers.
func TestModel(t *testing.T) {
	sqltest.Model(t, sqliteBackends)
}
