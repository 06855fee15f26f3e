// Package sqlkeys keys messages consumed with watermill-sql v3
// (github.com/ThreeDotsLabs/watermill-sql/v3) by the row that carried
// them, for rows other producers insert with plain SQL. For watermill-sql
// v4 use github.com/watermill-dedup/dedup/keyfuncs/sqlkeys/v4: the same
// API on v4's adapters, and the same keys.
//
// watermill-sql delivers a row's uuid column as the message UUID, its
// payload column as the payload and its metadata column (a JSON object of
// strings) as the metadata. A producer that is not Watermill inserts rows
// like these (MySQL, then PostgreSQL, whose default schema also records
// the inserting transaction, for ordering):
//
//	INSERT INTO `watermill_payments` (uuid, payload, metadata)
//	VALUES ('pay-42:capture', '{"amount": 5}', '{"source": "billing"}');
//
//	INSERT INTO "watermill_payments" (uuid, payload, metadata, transaction_id)
//	VALUES ('pay-42:capture', '{"amount": 5}', '{"source": "billing"}', pg_current_xact_id());
//
// (the offset column numbers the rows, created_at defaults to now). The
// uuid column holds at most 36 characters: PostgreSQL, and MySQL in its
// default strict sql_mode, refuse a longer value, but MySQL without
// STRICT_TRANS_TABLES (or STRICT_ALL_TABLES) cuts it to 36 with only a
// warning, and two ids that share their first 36 characters become one
// key. Keep ids that long or shorter (a UUID is 36), or put a longer id in
// the metadata and key by it with keyfuncs.Metadata. When
// it writes the event's own id into uuid, the middleware's default key,
// keyfuncs.MessageID(), deduplicates its republishes and watermill-sql's
// redeliveries. When it writes a fresh value each time (a random UUID, or
// an empty string), a republish is a new message: key by business fields
// (keyfuncs.JSON), or, to catch redeliveries of the same row only, by the
// row's offset ([Offset], with [SchemaAdapter] as the pub/sub's schema
// adapter). The metadata column must be NULL or a JSON object whose values
// are all strings ({"source": "billing"}, not {"attempt": 1}): anything
// else fails the row in watermill-sql itself, before any middleware runs,
// and the subscriber retries that row for ever, stalling the topic behind
// it. watermill-sql does not deliver created_at: for the middleware's
// ttl-miss check, have the producer write the publication time into the
// metadata (an RFC 3339 "published_at", say) and set
// middleware.Config.PublishedAt to middleware.MetadataTime("published_at").
//
// It is a separate package so that importing keyfuncs does not pull
// watermill-sql into every build, and each major has its own, so that a
// build compiles only the major it uses.
package sqlkeys
