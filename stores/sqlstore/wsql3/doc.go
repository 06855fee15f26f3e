// Package wsql3 lets sqlstore's transactional inbox join a watermill-sql
// v3 subscriber's transaction (sqlstore.Config.JoinTx):
//
//	sub, err := wsql3.NewSubscriber(db, subscriberConfig, logger)
//	store, err := sqlstore.New(db, sqlstore.Config{JoinTx: wsql3.SubscriberTx})
//
// Begin then works inside the subscriber's transaction under a
// SAVEPOINT, so that the offset ack, the dedup record and the handler's
// writes commit together. It is a package of its own so that sqlstore
// compiles no watermill-sql major; stores/sqlstore/wsql4 is v4's.
//
// # Why a subscriber of its own
//
// watermill-sql commits its transaction whenever a delivery ends, acked
// or not: when the subscriber closes (a router's Close, in a deploy),
// when its context ends, when the AckDeadline passes. A handler still
// running would have its record, and part of its writes, committed
// without the offset, and the redelivery would be acked as a duplicate.
// NewSubscriber's subscriber does not let that commit happen: Close
// waits for the deliveries in flight to be acked or nacked before the
// watermill-sql subscriber closes; a delivery that outlives the
// AckDeadline, or whose transaction the database aborted (a MySQL
// deadlock, which leaves the client's transaction open and running its
// later statements in autocommit), has its transaction rolled back before
// it is given up (its batch is delivered again; no effect of it is kept).
// SubscriberTx refuses the transaction of a subscriber built otherwise
// (ErrNotGuarded). stores/sqlstore/README.md has the details.
package wsql3
