// Package publisher deduplicates on the producer side: a Watermill
// message.PublisherDecorator, on the same stores, key functions and
// metrics as the consumer middleware, that publishes each message once
// per window however often the producer retries — an HTTP handler retried
// by its client, a cron job that fires twice, a producer restarted in the
// middle of a batch. It is the dedup on send of SQS FIFO queues (five
// minutes) or Kafka's idempotent producer (one producer session), for
// every Watermill publisher, with a window of your choice (Retention) and
// a store shared by every producer instance. It runs the same claim cycle
// as the consumer middleware, on the same settings (dedup.Policy), errors
// and metrics.
//
//	dp, err := publisher.New(publisher.Config{
//		Store: store,
//		Key:   keyfuncs.JSON("order_id"), // the business event, whatever its UUID
//	})
//	...
//	pub, err := dp.Decorate(kafkaPublisher) // or router.AddPublisherDecorators(dp.Decorate)
//	...
//	err = pub.Publish("orders", msg) // published once per Retention
//
// # Flow
//
// For every message of a Publish(topic, msgs...) call:
//
//  1. keys := Config.Key(msg). A message that cannot be keyed fails the
//     whole call with an error wrapping keyfuncs.ErrNoKey before anything
//     is claimed or published; it is logged and counted
//     (dedup.OutcomeNoKey).
//  2. Claim the keys in the scope (by default "publish:" and the topic),
//     for Lease. A message that shares a key with an earlier message of
//     the same call is a duplicate of it.
//  3. Duplicate: the message is not published (dedup.OutcomeDuplicate).
//     InProgress (another producer is publishing it): claim again every
//     Tuning.InProgressPoll for up to InProgressWait, then fail the call
//     with dedup.ErrInProgress. A store failure fails the call
//     (FailClosed) or, for an outage under FailOpen, publishes the
//     message unprotected.
//  4. The claimed messages are published in one call of the decorated
//     publisher, in their order, while the heartbeat extends their
//     leases. When it fails, every claim of the call is released and its
//     error returned, so the caller's retry publishes them.
//  5. Success: every claim is completed, keeping its record for
//     Retention. A Complete that fails for any reason not known to be
//     permanent is retried for Tuning.CompleteTimeout; one found lost is
//     reconciled (a Complete whose reply was lost finds its own record
//     done).
//
// A call that fails publishes nothing and leaves no claim behind, except
// that the decorated publisher may have sent some of the messages before
// it failed (Kafka and AMQP publishers send one message after another):
// those are published again by the retry.
//
// # Guarantees
//
//	what happens                                 ModeLease                         ModeTransactional
//	producer retries a publish within Retention  published once                    enters the outbox once
//	two producers publish the same key at once   once; the other waits or gets     once; the other waits for the
//	                                             ErrInProgress                     first transaction to end
//	the publish call fails                       claims released; retry publishes  savepoints rolled back; retry
//	                                             (again, for messages it sent)     publishes
//	producer dies between publish and record     keys held for Lease, then a       nothing is committed: record
//	                                             retry publishes again             and outbox row go together
//	a publish call outlasts Lease                the lease is extended meanwhile;  — (no lease)
//	                                             only a store unreachable for
//	                                             longer than Lease lets another
//	                                             producer take over
//	the decorated publisher panics               claims released, panic goes on    savepoints rolled back, panic
//	                                                                               goes on
//	the record cannot be written after publish   retried for CompleteTimeout;      Publish fails; the caller
//	                                             then logged, counted              rolls its transaction back
//	                                             (store_error): a retry within
//	                                             Lease gets ErrInProgress, after
//	                                             it publishes
//	retry after Retention                        published again                   enters the outbox again
//	store unavailable                            FailClosed: error, nothing        error, nothing published
//	                                             published; FailOpen: published,
//	                                             counted (bypassed)
//
// New refuses a configuration the store cannot honour (a Retention or
// Lease beyond its stores.Capabilities, ModeTransactional on a store that
// cannot join the caller's transaction), before anything is published.
//
// ModeLease is at-least-once publishing, exactly-once within the window
// otherwise. ModeTransactional, with watermill-sql's publisher on the same
// transaction as the record, is exactly-once into the outbox: the
// outbox example of package
// [github.com/watermill-dedup/dedup/stores/sqlstore/wsql3] wires it.
package publisher
