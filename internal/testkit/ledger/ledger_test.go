package ledger_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

func uniqueTable(t testing.TB) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "testkit_ledger_" + hex.EncodeToString(b[:])
}

// checkLedger records effects with and without accounts and checks what
// the ledger returns.
func checkLedger(t *testing.T, l ledger.Ledger) {
	t.Helper()
	ctx := context.Background()
	in := []ledger.Effect{
		{Event: "e1"},
		{Event: "e2", Key: "p2", Account: "c1", Amount: 5, Message: "m2"},
		{Event: "e3", Key: "p2", Account: "c1", Amount: 7, Message: "m3"},
		{Event: "e3", Key: "p3", Account: "c2", Amount: 1, Message: "m4"},
	}
	for _, e := range in {
		if err := l.Record(ctx, e); err != nil {
			t.Fatalf("Record(%+v): %v", e, err)
		}
	}
	if err := l.Record(ctx, ledger.Effect{Key: "x"}); err == nil {
		t.Error("Record of an effect without Event succeeded")
	}
	got, err := l.Effects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) {
		t.Errorf("Effects = %+v, want %+v", got, in)
	}
	if ev := ledger.EventsOf(got); !reflect.DeepEqual(ev, []string{"e1", "e2", "e3", "e3"}) {
		t.Errorf("EventsOf = %v", ev)
	}
	tot, err := l.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := ledger.Totals{
		Effects: 4, Amount: 13, Balance: 13,
		PerEvent: map[string]int64{"e1": 1, "e2": 1, "e3": 2},
		PerKey:   map[string]int64{"p2": 2, "p3": 1},
	}
	if !reflect.DeepEqual(tot, want) {
		t.Errorf("Totals = %+v, want %+v", tot, want)
	}
}

func TestMemLedger(t *testing.T) {
	var l ledger.Mem // the zero value is ready
	checkLedger(t, &l)
	if l.Count("e3") != 2 || l.Count("none") != 0 || l.Len() != 4 {
		t.Errorf("Count(e3)=%d Count(none)=%d Len=%d, want 2 0 4", l.Count("e3"), l.Count("none"), l.Len())
	}
}

func TestSQLLedger(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.SQLite, sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			db := openTestDB(t, d)
			ctx := context.Background()
			l, err := ledger.NewSQL(db, ledger.SQLConfig{Dialect: d, Table: uniqueTable(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.CreateTables(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := l.DropTables(context.Background()); err != nil {
					t.Error(err)
				}
			})
			checkLedger(t, l)

			// In a transaction ctx carries: rolled back, nothing stays.
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Record(sqlstore.WithTx(ctx, tx), ledger.Effect{Event: "rolled-back", Account: "c1", Amount: 100}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			tot, err := l.Totals(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tot.Effects != 4 || tot.Balance != 13 {
				t.Errorf("after a rolled-back Record: %d effects, balance %d; want 4, 13", tot.Effects, tot.Balance)
			}

			strict, err := ledger.NewSQL(db, ledger.SQLConfig{Dialect: d, Table: l.Tables()[0], RequireTx: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := strict.Record(ctx, ledger.Effect{Event: "e9"}); !errors.Is(err, ledger.ErrNoTx) {
				t.Errorf("RequireTx without a transaction: %v, want ErrNoTx", err)
			}
		})
	}
}

func TestSQLLedgerConfig(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []ledger.SQLConfig{
		{Dialect: sqlstore.SQLite},
		{Dialect: sqlstore.SQLite, Table: "Bad-Name"},
		{Dialect: sqlstore.SQLite, Table: "x; DROP TABLE y"},
		{Dialect: "oracle", Table: "ok"},
	} {
		if _, err := ledger.NewSQL(db, c); err == nil {
			t.Errorf("NewSQL(%+v) succeeded", c)
		}
	}
}

func openTestDB(t *testing.T, d sqlstore.Dialect) *sql.DB {
	t.Helper()
	var (
		db  *sql.DB
		err error
	)
	switch d {
	case sqlstore.Postgres:
		db, err = sql.Open("pgx", testkit.RequirePostgres(t))
	case sqlstore.MySQL:
		db, err = sql.Open("mysql", testkit.RequireMySQL(t))
	default:
		db, err = sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "ledger.db")))
		if err == nil {
			db.SetMaxOpenConns(1)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
