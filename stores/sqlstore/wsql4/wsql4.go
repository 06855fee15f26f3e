// Package wsql4 finds watermill-sql v4's subscriber transaction in a
// message's context, for sqlstore to join (sqlstore.Config.JoinTx):
//
//	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), subscriberConfig, logger)
//	store, err := sqlstore.New(db, sqlstore.Config{JoinTx: wsql4.SubscriberTx})
//
// Begin then works inside the subscriber's transaction under a
// SAVEPOINT, so that the offset ack, the dedup record and the handler's
// writes commit together (see sqlstore.Config.JoinTx, and its warning on
// the subscriber's AckDeadline). It is a package of its own so that
// sqlstore compiles no watermill-sql major; stores/sqlstore/wsql3 is v3's.
//
// # database/sql, not pgx
//
// v4's subscriber puts a wsql.Tx in the context: a *wsql.StdSQLTx, which
// wraps a *sql.Tx, when it is on database/sql (wsql.BeginnerFromStdSQL),
// and a *wsql.PgxTx, which wraps a pgx.Tx, when it is on pgx itself
// (wsql.BeginnerFromPgx). sqlstore joins the first. It cannot join the
// second: a transaction belongs to the one server connection it was begun
// on, the store sends its statements through its *sql.DB, whose
// connections are others, and database/sql has no way to take in a
// connection, or a transaction, that pgx opened (pgx's stdlib package
// makes a *sql.DB of a pgx pool, each *sql.Conn a connection taken from
// it, never one already lent out). Its statements would run in a second
// transaction, committing the record apart from the handler's writes, and
// waiting on the locks of the first one. SubscriberTx refuses it with
// ErrNotDatabaseSQL instead (Begin fails with sqlstore.ErrTxNotJoinable;
// the middleware nacks and logs it), and the handler's writes go nowhere.
// Instead:
//
//   - keep pgx and join: build the subscriber on database/sql over the
//     same pool, wsql.BeginnerFromStdSQL(stdlib.OpenDBFromPool(pool))
//     (github.com/jackc/pgx/v5/stdlib): pgx is still the driver, and the
//     subscriber's transaction is a *sql.Tx the store joins, and the
//     handler writes in (sqlstore.TxFromContext gives it);
//   - or keep the pgx subscriber and do not join: leave Config.JoinTx nil.
//     Begin opens an inbox transaction of the store's own, which the
//     handler writes its effects in (sqlstore.TxFromContext, not the
//     subscriber's transaction): effect and record commit together, and
//     the offset ack commits apart, after, in the subscriber's; a
//     redelivery after a lost ack is a duplicate.
package wsql4

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// ErrNotDatabaseSQL is SubscriberTx's error for a subscriber transaction
// that is not database/sql's (see the package doc): Begin fails with it
// (and with sqlstore.ErrTxNotJoinable), writing nothing.
var ErrNotDatabaseSQL = errors.New("wsql4: the watermill-sql v4 subscriber's transaction is not a database/sql one, which sqlstore cannot join")

// SubscriberTx is a sqlstore.TxFinder: it returns the *sql.Tx of the
// transaction a watermill-sql v4 subscriber on database/sql put in ctx
// (wsql.TxFromContext), or nil when there is none. A transaction of
// another kind, pgx's above all, is refused with ErrNotDatabaseSQL.
func SubscriberTx(ctx context.Context) (*sql.Tx, error) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok || tx == nil {
		return nil, nil
	}
	switch t := tx.(type) {
	case *wsql.StdSQLTx:
		if t == nil {
			return nil, nil
		}
		return t.Tx, nil
	case wsql.StdSQLTx:
		return t.Tx, nil
	case *wsql.PgxTx, wsql.PgxTx:
		return nil, fmt.Errorf("%w: it is pgx's (a subscriber on wsql.BeginnerFromPgx), on a connection the store's database/sql pool cannot reach; "+
			"build the subscriber on wsql.BeginnerFromStdSQL(stdlib.OpenDBFromPool(pool)) to join it, or leave Config.JoinTx nil for an inbox transaction of the store's own", ErrNotDatabaseSQL)
	default:
		return nil, fmt.Errorf("%w: it is a %T; sqlstore joins the *wsql.StdSQLTx of a subscriber on wsql.BeginnerFromStdSQL", ErrNotDatabaseSQL, tx)
	}
}

var _ sqlstore.TxFinder = SubscriberTx
