// Package middleware is the Watermill handler middleware that gives a
// router exactly-once effects on top of at-least-once brokers.
//
// For every message it runs this flow:
//
//  1. keys := Config.Key(msg). A message that cannot be keyed fails with an
//     error wrapping keyfuncs.ErrNoKey; the store is not touched. It is
//     logged at error level and counted (dedup.OutcomeNoKey); route it to
//     a poison queue (see dedup.IsPermanent).
//  2. Claim the keys in the store, bounded by StoreTimeout. A store error
//     follows OnStoreError: dedup.FailClosed nacks, dedup.FailOpen runs
//     unprotected through an outage.
//  3. Duplicate: ack without running the handler, re-emitting the outputs
//     stored with the record. InProgress: return dedup.ErrInProgress
//     (nack), after waiting up to InProgressWait for the other run.
//  4. Claimed: run the handler with the claim in its context, extending the
//     lease every Tuning.Heartbeat.
//  5. Handler error or panic: Release the claim, then return the error (or
//     re-panic) so the message is nacked and can be retried.
//  6. Success: Complete the record, storing the handler's produced messages
//     with it, then return them for the router to publish. The effect has
//     happened: every failure of the Complete not known to be permanent
//     is retried for Tuning.CompleteTimeout, whatever becomes of the
//     message's context.
//
// New refuses, before any handler runs, a configuration the store cannot
// honour: a Lease or Retention beyond the store's bounds
// (stores.Capabilities), ModeTransactional on a store without an inbox.
//
// The claim cycle is shared with the publisher decorator
// ([github.com/watermill-dedup/dedup/publisher]), and so are the settings
// (dedup.Policy), the errors and the metrics.
//
// # Produced messages
//
// Watermill publishes a handler's produced messages after the middleware
// chain returns, and nacks the message if that publish fails. The record is
// already done by then, so the redelivery is a duplicate — and its outputs
// would be lost. This middleware keeps the outputs in the record and returns
// them again on every duplicate delivery, with the same UUIDs: outputs are
// published at least once, and a downstream consumer deduplicating by
// message id (this middleware's default key) sees them once. This is the
// outbox idea of NServiceBus, without a second table.
//
// # Guarantees
//
// No message is acked without its effect having happened: a handler error,
// a panic, a store outage (FailClosed) or a failed publish of outputs all
// nack. In lease mode an effect runs twice only when a consumer dies
// between its side effect and Complete (the next delivery takes the lease
// over after it expires: OutcomeTakeover); when the store stays unreachable
// longer than the lease while a handler runs (the lease cannot be extended)
// or longer than CompleteTimeout after it (the message is acked with its
// record still processing, so a duplicate arriving after the lease runs
// again); or when a redelivery arrives after Retention (OutcomeTTLMiss).
// Under ModeAsyncComplete the window of the first case extends past the
// ack, until the background Complete lands. Under ModeTransactional effects
// written in the store's database are never doubled.
//
// # Files
//
// middleware.go holds the flow every mode shares (keys, scope, the ttl
// check); lease.go the lease modes; async.go the background Completes of
// ModeAsyncComplete; transactional.go the inbox mode. The claim cycle
// itself (store calls, error classes, heartbeat, the Complete retry) is
// the module's internal/cycle, shared with the publisher.
package middleware
