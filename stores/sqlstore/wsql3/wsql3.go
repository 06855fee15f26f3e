// Package wsql3 finds watermill-sql v3's subscriber transaction in a
// message's context, for sqlstore to join (sqlstore.Config.JoinTx):
//
//	store, err := sqlstore.New(db, sqlstore.Config{JoinTx: wsql3.SubscriberTx})
//
// Begin then works inside the subscriber's transaction under a
// SAVEPOINT, so that the offset ack, the dedup record and the handler's
// writes commit together (see sqlstore.Config.JoinTx, and its warning on
// the subscriber's AckDeadline). It is a package of its own so that
// sqlstore compiles no watermill-sql major; stores/sqlstore/wsql4 is v4's.
package wsql3

import (
	"context"
	"database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// SubscriberTx is a sqlstore.TxFinder: it returns the transaction a
// watermill-sql v3 subscriber put in ctx (wsql.TxFromContext), or nil
// when there is none. It never fails: v3's transaction is always a
// *sql.Tx.
func SubscriberTx(ctx context.Context) (*sql.Tx, error) {
	if tx, ok := wsql.TxFromContext(ctx); ok && tx != nil {
		return tx, nil
	}
	return nil, nil
}

var _ sqlstore.TxFinder = SubscriberTx
