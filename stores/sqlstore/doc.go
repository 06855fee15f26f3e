// Package sqlstore keeps dedup records in a SQL table, over database/sql,
// on PostgreSQL, MySQL/MariaDB or SQLite.
//
// It offers both modes of the middleware:
//
//   - lease mode ([stores.Store]): Claim inserts a processing record,
//     Complete turns it into a done record. Records survive restarts and are
//     shared by every process using the table.
//   - transactional inbox mode ([stores.Inbox]): Begin inserts a done record
//     inside a transaction that the handler's own writes join (through
//     [TxFromContext]); commit writes effect and record together, rollback
//     neither. Inside a watermill-sql subscriber's transaction (found by
//     [Config].JoinTx: wsql3.SubscriberTx for watermill-sql v3,
//     wsql4.SubscriberTx for v4, in packages of their own so that this one
//     compiles neither major) it uses a SAVEPOINT, so offset ack, dedup
//     record and business write commit together. The subscriber must be
//     built by the same package (wsql3.NewSubscriber, wsql4.NewSubscriber),
//     which commits only what the router acked: watermill-sql itself
//     commits its transaction when it closes or a delivery outlives its
//     AckDeadline, under a handler still running.
//
// # Schema
//
// One table, keyed by a 128-bit digest of (scope, key) ([RecordID]), with
// the fencing token (NULL once done), one expiry column (lease end while
// processing, retention end once done) and the opaque data; MySQL and
// SQLite also keep the state in a column of its own, PostgreSQL tells it
// from the token. The exact DDL per dialect, and what a record costs on
// disk, are in README.md; [Store.CreateSchema] runs the DDL.
//
// # Group commit
//
// Concurrent single-key lease-mode calls (Claim, Complete, Release,
// Extend) that arrive while a batch is running are coalesced into the
// next batch: one round trip and one commit for all of them, each call
// with its own result (see [BatchConfig]; on by default). A lone caller
// runs at once, on the statements an unbatched call runs.
//
// # Time
//
// Leases and expiry are computed in Go with Config.Clock and passed to the
// database as parameters; the database clock is never read. Consumers
// sharing a table must keep their clocks roughly in sync (NTP): a consumer
// whose clock runs ahead by d sees other consumers' leases expire d early,
// so clock skew eats into the lease.
//
// # Admin
//
// The Store implements [stores.Admin], which the dedupctl command uses.
// The table keeps the digest of (scope, key), not the pair: Get and
// Delete find a record by its scope and key, GetByID and DeleteByID by
// its ID, List lists records by ID (RecordID as a UUID, in its order)
// and fails with
// [stores.ErrNotSupported] for a scope or a key prefix, and Stats counts
// records by state, not by scope. List and Stats read the whole table.
//
// # Retention
//
// Expired records are never treated as live, whether or not they have been
// deleted. [Store.Purge] deletes them in bounded batches; set
// Config.PurgeInterval to run it in the background.
package sqlstore
