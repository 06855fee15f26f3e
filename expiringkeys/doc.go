// Package expiringkeys keeps the keys of Watermill's own Deduplicator
// (message/router/middleware.Deduplicator) in a dedup store, so that
// every consumer and producer sharing the store drops the same
// duplicates. [New] returns a [Repository], a Watermill
// ExpiringKeyRepository, on any [stores.Store]: memstore, redisstore,
// sqlstore (PostgreSQL, MySQL/MariaDB, SQLite) or natsstore (JetStream
// KV). The Deduplicator's Middleware and PublisherDecorator take it
// unchanged:
//
//	repo, err := expiringkeys.New(store, expiringkeys.Config{Scope: "orders", Window: time.Hour})
//	// was: repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
//	d := &middleware.Deduplicator{KeyFactory: middleware.NewMessageHasherSHA256(math.MaxInt64), Repository: repo}
//	router.AddMiddleware(d.Middleware)
//
// A key is kept as a dedup record under (Config.Scope, key): claimed
// under Config.Lease, then recorded done for Config.Window. An
// IsDuplicate finding it done returns true; finding it claimed by another
// caller, it waits for that caller (Config.InProgressWait) and returns
// true once the key is marked, or marks it itself if the claim is given
// back or its lease runs out.
//
// # What the Deduplicator does with IsDuplicate
//
// Watermill's Deduplicator (v1.5) calls IsDuplicate with the message's
// context bounded by its Timeout (one minute by default, five
// milliseconds at least): the Timeout bounds both store calls of a mark,
// and the wait for a key another caller holds. Keep it above
// Config.InProgressWait (the defaults, one minute and 30s, are), so that
// the wait ends in an answer rather than an error.
// Its Middleware drops a message for which IsDuplicate returns true (the
// handler does not run and the message is acked) and returns an error of
// IsDuplicate from the handler without running it, so the router nacks
// the message (or Watermill's Retry middleware retries it) and the
// redelivery asks again. Its PublisherDecorator acks and leaves out of
// the publish a message found a duplicate, and fails the whole Publish
// call, publishing nothing, on an error of IsDuplicate: the messages of
// the call it marked before the error stay marked, and a retry of the
// call drops them.
//
// # What the Deduplicator gives up
//
// The Deduplicator marks a key before the handler (or the publish)
// runs, and never unmarks it. Sharing its keys through a store does not
// change that: a handler that fails, a consumer that crashes, or a
// publish that fails after the keys were marked, and the message's
// redelivery (or the producer's retry) is dropped as a duplicate within
// the Window: its effect never happens. Its keys have no lease held
// while the handler runs and keep no handler outputs. The dedup
// middleware ([github.com/watermill-dedup/dedup/middleware]) and the
// publisher decorator ([github.com/watermill-dedup/dedup/publisher])
// release the claim of an effect that failed, lease it while it runs,
// and record it done after; use them for effects that must happen once.
// This package is for a router already built on the Deduplicator that
// needs its keys shared between processes.
//
// # Logs and metrics
//
// Every IsDuplicate reports one outcome to Config.Metrics by Scope, and
// every store call its latency and error, as the middleware does, so the
// prommetrics and otelmetrics packages export them on the same series. A
// key counted as seen while another caller holds it (past
// InProgressWait) is logged to Config.Logger with its scope and key:
// the Deduplicator drops its message on a presumption. So is a takeover
// of a key whose claim's lease ran out (counted as OutcomeTakeover too):
// the caller that held it may get false for the key as well. Errors are
// returned, and the router logs them.
//
// The package imports the stores and Watermill; nothing in this module
// imports it.
package expiringkeys
