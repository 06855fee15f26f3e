package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql4"
)

// TestJoinWatermillTxNeedsJoinTx: the deprecated JoinWatermillTx alone
// no longer finds a transaction (sqlstore imports no watermill-sql
// major), and New refuses it, naming the fix, rather than let Begin open
// transactions of its own where a handler expects the subscriber's.
func TestJoinWatermillTxNeedsJoinTx(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.SQLite, JoinWatermillTx: true})
	if err == nil || !strings.Contains(err.Error(), "wsql3.SubscriberTx") || !strings.Contains(err.Error(), "wsql4.SubscriberTx") {
		t.Fatalf("New with JoinWatermillTx alone = %v, want a refusal naming JoinTx's finders", err)
	}
	for _, f := range []sqlstore.TxFinder{wsql3.SubscriberTx, wsql4.SubscriberTx} {
		s, err := sqlstore.New(db, sqlstore.Config{Dialect: sqlstore.SQLite, JoinWatermillTx: true, JoinTx: f})
		if err != nil {
			t.Fatalf("New with JoinWatermillTx and JoinTx: %v", err)
		}
		_ = s.Close(context.Background())
	}
}

// TestJoinTxNone: a finder that finds nothing leaves Begin to open its
// own transaction; one that refuses fails Begin with ErrTxNotJoinable and
// its own error, and JoinedTx reports the refusal as a transaction (equal
// for equal refusals), not as none.
func TestJoinTxNone(t *testing.T) {
	forEachBackend(t, backends[2:], func(t *testing.T, b backend) {
		db := b.open(t)
		ctx := context.Background()
		for _, f := range []sqlstore.TxFinder{wsql3.SubscriberTx, wsql4.SubscriberTx} {
			s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: f})
			if _, ok := s.JoinedTx(ctx); ok {
				t.Fatal("JoinedTx of a context without a transaction reports one")
			}
			itx, err := s.Begin(ctx, "scope", []string{"k"}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := itx.Commit(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		refusal := errors.New("a transaction of another kind")
		s := newStore(t, db, b.dialect, sqlstore.Config{JoinTx: func(context.Context) (*sql.Tx, error) { return nil, refusal }})
		if _, err := s.Begin(ctx, "scope", []string{"k"}, time.Hour); !errors.Is(err, sqlstore.ErrTxNotJoinable) || !errors.Is(err, refusal) {
			t.Fatalf("Begin refused by JoinTx = %v, want ErrTxNotJoinable and the finder's error", err)
		}
		tx1, ok1 := s.JoinedTx(ctx)
		tx2, ok2 := s.JoinedTx(ctx)
		if !ok1 || !ok2 || tx1 != tx2 {
			t.Fatalf("JoinedTx of a refused transaction = %v %v, %v %v; want it reported, equal each time", tx1, ok1, tx2, ok2)
		}
		if n := countRows(t, db, b.dialect, s.Table()); n != 0 {
			t.Fatalf("%d records after a refused Begin", n)
		}
	})
}
