// Package wsql4 lets sqlstore's transactional inbox join a watermill-sql
// v4 subscriber's transaction (sqlstore.Config.JoinTx):
//
//	sub, err := wsql4.NewSubscriber(db, subscriberConfig, logger)
//	store, err := sqlstore.New(db, sqlstore.Config{JoinTx: wsql4.SubscriberTx})
//
// Begin then works inside the subscriber's transaction under a
// SAVEPOINT, so that the offset ack, the dedup record and the handler's
// writes commit together. It is a package of its own so that sqlstore
// compiles no watermill-sql major; stores/sqlstore/wsql3 is v3's, and its
// package doc says why the subscriber must be NewSubscriber's: the same
// holds for v4, which commits its transaction when a delivery ends
// without an ack too.
//
// # database/sql, not pgx
//
// NewSubscriber takes a database/sql handle (a *sql.DB; over a pgx pool,
// stdlib.OpenDBFromPool from github.com/jackc/pgx/v5/stdlib): pgx is
// still the driver, and the subscriber's transaction is a *sql.Tx the
// store joins and the handler writes in (sqlstore.TxFromContext gives
// it). A subscriber on pgx itself (wsql.BeginnerFromPgx) cannot be
// joined: its transaction belongs to a connection the store's *sql.DB
// cannot reach, and pgx does not roll a transaction back when its
// context ends, which the guard relies on. SubscriberTx refuses its
// transaction with ErrNotDatabaseSQL (Begin fails with
// sqlstore.ErrTxNotJoinable; the middleware nacks and logs it). Keep such
// a subscriber and leave Config.JoinTx nil instead: Begin then opens an
// inbox transaction of the store's own, effect and record commit
// together in it, and the offset ack commits apart, after, in the
// subscriber's; a redelivery after a lost ack is a duplicate.
package wsql4
