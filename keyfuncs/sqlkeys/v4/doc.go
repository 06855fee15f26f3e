// Package sqlkeys keys messages consumed with watermill-sql v4
// (github.com/ThreeDotsLabs/watermill-sql/v4) by the row that carried
// them, for rows other producers insert with plain SQL. It is
// github.com/watermill-dedup/dedup/keyfuncs/sqlkeys (for watermill-sql v3)
// on v4's adapters: the same [SchemaAdapter], [Offset] and
// [MetadataOffset], the same keys, so consumers may move from v3 to v4
// without their records changing meaning. That package's doc shows the
// INSERT another producer runs and what its columns must hold (a uuid of
// at most 36 characters; a metadata column NULL or a JSON object of
// strings, anything else stalling the topic inside watermill-sql; no
// created_at delivered, so a producer that wants the ttl-miss check
// writes its time into the metadata). It compiles nothing of v3.
//
// [SchemaAdapter] wraps any of v4's schema adapters: DefaultPostgreSQLSchema
// and DefaultMySQLSchema (consumer groups, offsets acked per group), and
// PostgreSQLQueueSchema and MySQLQueueSchema (no consumer groups; rows
// marked acked, or deleted with the queue offsets adapter's
// DeleteOnAck). In each the offset column numbers the rows and is never
// given again while the table lives, so [Offset] names one row; when a
// topic's table is dropped and created again the numbers start over:
// purge the scope's records (or use a new topic name) then.
//
// With the queue schemas, set SubscribeBatchSize to 1. Their offsets
// adapters (v4.1.2) ack every row of the batch the subscriber read,
// delivered or not, when the batch is cut short (the subscriber closing,
// an AckDeadline passing): those rows are never delivered again, and no
// key can bring back a message that never arrives. A batch of one row is
// acked only when its message was. A subscriber built by
// github.com/watermill-dedup/dedup/stores/sqlstore/wsql4.NewSubscriber
// hands the adapter only the rows up to the last acked one, and needs no
// such setting.
//
// With the pgx adapter (BeginnerFromPgx) as with database/sql
// (BeginnerFromStdSQL), the subscriber hands the adapter the same rows.
package sqlkeys
