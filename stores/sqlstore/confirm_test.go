package sqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestConfirmationNeverWaitsForTheCallersConnection: a broken connection
// is confirmed as an outage by a call on another connection of the pool
// (see the README's Errors section). With the pool at its limit, that
// call must not wait for a connection the caller itself holds: the
// database goes down (the proxy cut: connections closed, new dials
// refused) under a pool of one connection, held by the caller.
//
//   - An inbox transaction's Commit with data: its statement fails on the
//     broken connection; the transaction is ended (its connection given
//     back) before the confirmation, which finds the database down.
//   - A Begin joined to the application's own transaction (sqlstore.WithTx),
//     which keeps the only connection: no other is free to confirm with,
//     and the call returns at once, no known outage, rather than wait.
//
// The calls run under contexts without a deadline: nothing but the
// store's own rule ends them.
func TestConfirmationNeverWaitsForTheCallersConnection(t *testing.T) {
	forEachBackend(t, serverBackends, func(t *testing.T, b backend) {
		t.Run("inbox commit", func(t *testing.T) {
			s, db, p := proxiedStore(t, b, sqlstore.Config{})
			db.SetMaxOpenConns(1)
			bg := context.Background()
			itx, err := s.Begin(bg, "s", []string{"k"}, time.Hour)
			if err != nil || itx.Result() != stores.Claimed {
				t.Fatalf("Begin = %v, %v", itx, err)
			}
			p.Cut()
			within(t, "Commit on a database gone down, its transaction holding the pool's only connection", time.Minute, func() {
				err = itx.Commit(bg, []byte("data"))
			})
			if !errors.Is(err, stores.ErrUnavailable) {
				t.Fatalf("Commit on a database gone down = %v, want ErrUnavailable", err)
			}
		})
		t.Run("joined begin", func(t *testing.T) {
			s, db, p := proxiedStore(t, b, sqlstore.Config{})
			db.SetMaxOpenConns(1)
			bg := context.Background()
			if _, err := s.Claim(bg, "s", []string{"first"}, time.Minute); err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(bg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(bg, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			p.Cut()
			within(t, "a joined Begin on a database gone down, the application's transaction holding the pool's only connection", time.Minute, func() {
				_, err = s.Begin(sqlstore.WithTx(bg, tx), "s", []string{"j"}, time.Hour)
			})
			if err == nil {
				t.Fatal("a joined Begin on a database gone down succeeded")
			}
			t.Logf("joined Begin: %v", err)
		})
	})
}
