// Package wsqlguard keeps a watermill-sql subscriber from committing its
// transaction under a delivery the router has not acked, for the
// subscribers of sqlstore's wsql3 and wsql4 packages.
//
// watermill-sql (v3 and v4) runs each batch of messages in one
// transaction: it writes the offset of every acked message in it and
// commits it when the batch ends. A batch also ends, and is committed,
// when a delivery ends without an ack: the subscriber closing, its
// context ending, or its AckDeadline passing. A handler that joined the
// transaction (sqlstore.Config.JoinTx) may have written part of its
// effect, and the inbox its done record, by then: the commit would keep
// them without the ack, and the redelivery would be acked as a
// duplicate.
//
// A Subscriber sits between the router and the watermill-sql subscriber
// and makes the commit of such a transaction impossible rather than
// unlikely. The watermill-sql subscriber begins its transactions through
// a Beginner that calls BeginTx: each transaction gets a context the
// guard cancels (database/sql rolls back a transaction whose context ends
// and refuses to commit it), and the guard keeps it to roll it back. Then:
//
//   - the router's ack and nack go to watermill-sql as they are (an ack
//     comes after the inbox committed its savepoint; a nack after it
//     rolled back to it);
//   - Close stops taking messages, waits until every delivery in flight
//     is acked or nacked (or reaches its deadline), and only then closes
//     the watermill-sql subscriber, which commits what was acked;
//   - the end of a subscription's context (a router cancels it when it
//     closes) stops it taking messages and ends the context of the
//     delivery in flight, but not the transaction's: Close commits it;
//   - the AckDeadline is the guard's (the watermill-sql subscriber is
//     built without one): when a delivery outlives it, the guard rolls the
//     transaction back first, then releases the delivery. The batch's
//     messages are delivered again;
//   - a transaction the database ended under its client (Abort, which
//     sqlstore calls when it finds one) is rolled back on the client too
//     before its delivery ends, so that nothing runs in it afterwards.
//
// The subscriber's transaction must be database/sql's: pgx rolls nothing
// back when the context of a transaction ends.
package wsqlguard
