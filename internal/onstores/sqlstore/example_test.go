package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// Example wires the store on an embedded SQLite database and runs one
// message through the transactional inbox twice: the second delivery is a
// duplicate, and the business write happened once.
func Example() {
	dir, _ := os.MkdirTemp("", "sqlstore-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	ctx := context.Background()

	store, err := sqlstore.New(db, sqlstore.Config{PurgeInterval: 5 * time.Minute})
	if err != nil {
		panic(err)
	}
	defer store.Close(ctx)
	if err := store.CreateSchema(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE points (customer TEXT PRIMARY KEY, points INTEGER)`); err != nil {
		panic(err)
	}

	handle := func(eventID string) {
		itx, err := store.Begin(ctx, "loyalty", []string{eventID}, 24*time.Hour)
		if err != nil {
			panic(err)
		}
		fmt.Println(eventID, itx.Result())
		if itx.Result() != stores.Claimed {
			return // duplicate: ack without running the handler
		}
		hctx := itx.Context(ctx)
		tx, _ := sqlstore.TxFromContext(hctx)
		if _, err := tx.ExecContext(hctx, `INSERT INTO points VALUES ('CUS-291', 120)
			ON CONFLICT (customer) DO UPDATE SET points = points + 120`); err != nil {
			_ = itx.Rollback(ctx)
			panic(err)
		}
		if err := itx.Commit(ctx, nil); err != nil {
			panic(err)
		}
	}
	handle("evt-91827")
	handle("evt-91827") // redelivered after a crash before the ack

	var points int
	_ = db.QueryRowContext(ctx, `SELECT points FROM points WHERE customer = 'CUS-291'`).Scan(&points)
	fmt.Println("points:", points)
	// Output:
	// evt-91827 claimed
	// evt-91827 duplicate
	// points: 120
}
