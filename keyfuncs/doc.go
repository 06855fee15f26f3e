// Package keyfuncs builds dedup keys from Watermill messages.
//
// A [KeyFunc] returns the keys a message claims. When it returns several,
// the middleware claims them all in one record operation, all-or-nothing: the
// message is a duplicate when any of them was already done. The factories are
// named by what they read ([MessageID], [Metadata], [JSON], [PayloadSHA256]);
// the combinators ([All], [First], [Prefix]) compose them.
//
// The default to reach for in side-effecting consumers is to dedup on both the
// message id (catches broker redelivery) and a business key (catches a
// producer that republishes the same event under a new id):
//
//	keyfuncs.All(
//		keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
//		keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id", "operation")),
//	)
//
// Keys are stable across retries and bounded: a key longer than [MaxKeyLen]
// bytes is replaced by a digest of it (see [Bound]), never truncated. A
// message a KeyFunc cannot key — a missing field or header, an empty value, a
// payload that is not JSON — gets an error wrapping [ErrNoKey] that names the
// message and what was missing, and the store is not touched. Route such
// errors to a poison queue.
//
// Broker-specific extractors live in subpackages (keyfuncs/kafkakeys), so
// that importing keyfuncs pulls no broker client into a build, one per
// major of the Watermill pub/sub where they depend on its types:
// keyfuncs/sqlkeys for watermill-sql v3 and keyfuncs/sqlkeys/v4 for v4,
// keyfuncs/amqpkeys for watermill-amqp v2 and keyfuncs/amqpkeys/v3 for
// v3. The two of a pair have the same API and give the same keys, and a
// build compiles only the major it imports.
package keyfuncs
