package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// Example handles an event through the transactional inbox: Begin claims
// the event's id in a transaction of its own, the handler writes in that
// transaction, and Commit records the id done together with the writes,
// so a redelivery finds it a duplicate whatever crashed in between.
func Example() {
	var db *sql.DB // the service's pool: sql.Open("pgx", dsn), "mysql" or a SQLite driver's
	ctx := context.Background()
	store, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.Postgres})
	if err != nil {
		panic(err)
	}
	defer store.Close(ctx)

	handle := func(eventID, customer string, points int) error {
		itx, err := store.Begin(ctx, "loyalty", []string{eventID}, 24*time.Hour)
		if err != nil {
			return err // the store is down: nack, the broker redelivers
		}
		switch itx.Result() {
		case stores.Duplicate:
			return nil // done before: ack without writing
		case stores.InProgress:
			return errors.New("in progress elsewhere") // nack: that run may still fail
		}
		hctx := itx.Context(ctx)
		tx, _ := sqlstore.TxFromContext(hctx)
		if _, err := tx.ExecContext(hctx, `UPDATE points SET points = points + $1 WHERE customer = $2`, points, customer); err != nil {
			_ = itx.Rollback(ctx)
			return err
		}
		return itx.Commit(ctx, nil) // the record and the update, together
	}
	_ = handle
}
