// Package stores defines the contract between the dedup middleware and the
// backends that keep dedup records, and the sentinel errors every backend
// returns.
//
// A backend lives in its own package (memstore, redisstore, sqlstore,
// natsstore) and is checked by the conformance suite in
// [github.com/watermill-dedup/dedup/stores/storetest]; the checks of a
// call's arguments that backends share are in
// [github.com/watermill-dedup/dedup/stores/storekit].
//
// # The record
//
// A store keeps one record per (scope, key):
//
//	(scope, key) -> { state: processing|done, token, lease_until, expires_at, data? }
//
// Scope is usually the Watermill handler name, so two handlers consuming the
// same message each do their work once. Key is built by a keyfuncs.KeyFunc.
// Every (scope, key) pair is distinct: a store must never let two different
// pairs share a record, whatever bytes the scope and the key contain.
//
// # State machine
//
//	Claim     none / expired            -> processing(token, lease)  Claimed
//	          processing, lease valid   -> unchanged                 InProgress
//	          processing, lease expired -> processing(new token)     Claimed, Takeover
//	          done, not expired         -> unchanged                 Duplicate
//	Complete  processing(token)         -> done(expires_at, data)
//	Release   processing(token)         -> none
//	Extend    processing(token)         -> processing(new lease_until)
//
// Complete, Release and Extend are fenced: they act only while the record is
// still processing under the caller's token, and otherwise fail with
// [ErrLostClaim] and change nothing.
//
// A processing record whose lease ran out still belongs to its claim until
// another Claim takes it over: its owner's Complete, Release and Extend
// succeed. A store may forget such a record once its lease has been over
// for longer than the lease it was last given, never sooner; a takeover
// within that time reports Claim.Takeover.
//
// # Time
//
// Leases and retentions must be positive. A store keeps time at a
// precision of its own (memstore the nanosecond, sqlstore the
// microsecond, redisstore the millisecond) and rounds a duration up to
// it, never down: a 1ns lease is a live lease until the store's clock
// next ticks. A duration longer than the store can represent is capped at
// the longest it can, never wrapped around: math.MaxInt64 is a valid
// lease or retention meaning "about 292 years". A store with a shorter
// documented bound of its own (sqlstore's daily partitions) refuses
// longer durations with [ErrInvalidArgument].
//
// # Admin
//
// A store that implements [Admin] lets an operator read a record, list
// records, count them, delete one whoever holds it, and purge the
// expired ones: the dedupctl command is built on it. Its calls are for
// people and scripts, not for the message path, and List and Stats may
// read every record.
//
// Get and Delete find a record by (scope, key) on every layout, GetByID
// and DeleteByID by the ID a List showed. Listing
// and counting by scope need a layout that keeps the scope: memstore,
// sqlstore and natsstore keep each record under a digest of (scope,
// key), and so does redisstore with CompactKeys. There a record is known by its ID only,
// a List by Scope or KeyPrefix fails with [ErrNotSupported], and Stats
// has no per-scope counts. redisstore's default layout keeps the scope
// and the key (but for keys it stores as digests, DigestKeysLongerThan),
// and lists and counts by scope.
//
// # Errors
//
// Every error a store returns belongs to one of these classes, told apart
// with [errors.Is]. The middleware acts on the class, so a store must put
// each failure in the right one:
//
//   - [ErrUnavailable]: the backend could not be reached, or said it
//     cannot serve now (a connection refused or timed out before the
//     request went out; a server starting, shutting down, failing over or
//     out of connections). The outcome of the call is unknown. This is
//     the only class a fail-open consumer may run its handler through
//     unprotected, so an error is an outage only when it is known to be
//     one. A refusal of the client (its credentials, its TLS either way,
//     its permissions, a bad argument) never is, even when it shows up as
//     a reset, an EOF or a timeout (a server resetting the connection
//     before the client read its TLS alert, closing it after a failed
//     authentication); nor is a connection the server closed while a new
//     one still gets an answer: a broken connection is an outage only
//     when the backend is found down.
//   - The caller's context ended: the error wraps [context.Canceled] or
//     [context.DeadlineExceeded]. A call made with a context already done
//     fails so, before any I/O, and changes nothing; one whose context
//     ends while it is under way may or may not have taken effect. (The
//     middleware tells its own per-call timeout, an outage, from the end
//     of the message's context, a cancellation.)
//   - [ErrClosed]: the store was closed. Nothing was done.
//   - [ErrInvalidKey], [ErrInvalidArgument]: bad input, refused before any
//     I/O. Nothing was done.
//   - [ErrLostClaim]: a fenced call whose claim is no longer the owner.
//     Nothing was done.
//   - [ErrTxAborted] ([Inbox] only): the transaction Begin had to join
//     is no longer usable. Nothing was written.
//   - [ErrNotFound], [ErrWrongState], [ErrNotSupported] ([Admin] only):
//     no such record, a record in the other state, a request the
//     layout cannot serve. Nothing was done.
//   - Anything else: the backend answered with an error the store does not
//     classify (a missing table, a denied permission, a refused password
//     or certificate, a record it did not write), or failed in a way not
//     known to be an outage. A fault to fix, never a reason to bypass the
//     store.
package stores
