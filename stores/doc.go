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
// A store that implements [OwnerClaimer] (Capabilities.Owners) also
// keeps a small opaque owner with the processing records of a claim made
// by ClaimOwned, until they are completed, released or taken over, and
// returns it in Claim.Owner to a claim that takes such a record over or
// finds it in progress. Extend keeps it; a done record does not (its data
// is Complete's alone). The middleware keeps the claiming run's trace
// context there (dedup.Tracing.LinkRuns).
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
//
// # Adding a store
//
// A store is a package of its own under stores/ (the library never
// imports the programs' code). It provides:
//
//   - A [Store]: Claim, Complete, Release, Extend and Close as the state
//     machine, the fencing and the time rules above say, and
//     Capabilities stating its bounds (Kind, MaxLease, MaxRetention,
//     MaxScope, MaxKey, MaxData; zero for none) and what it implements
//     (NonBlocking, Admin, Inbox, JoinedTx). It refuses exactly what
//     exceeds a stated bound, before any I/O.
//   - [Admin], if an operator can read and delete its records
//     (cmd/dedupctl is built on it); [Inbox] and [TxJoiner] if it has a
//     transactional inbox.
//   - Tests that pass the conformance suites of
//     [github.com/watermill-dedup/dedup/stores/storetest]: storetest.Run
//     (its Admin checks too when it implements Admin, with AdminNoScopes
//     or AdminNoKeys for what its layout cannot list; ServerTime or
//     RealTime when its server keeps the time), storetest.RunModel, and
//     storetest.RunInbox when it implements Inbox. The package's own tests
//     import its backend's client and this module's light test kit only
//     (internal/testkit, and an internal/testkit/<backend>test package
//     for its servers, as redistest, natstest and sqltest are): every
//     module they import is downloaded by a service that imports the
//     store (README, Footprint). A test that needs another store, another
//     driver or a broker goes in internal/onstores.
//   - Every error in one of the classes under Errors, with this package's
//     sentinels: [ErrUnavailable] for known outages only (the network
//     errors every store tells the same way are in stores/internal/neterr),
//     [ErrClosed], [ErrInvalidKey], [ErrInvalidArgument] and [ErrTooLarge],
//     [ErrLostClaim], [ErrTxAborted], and [ErrNotFound], [ErrWrongState],
//     [ErrNotSupported] from Admin; a refusal (credentials, TLS,
//     permissions) is an error of its own, never an outage. Its tests
//     check the classes against a backend that is down and one that
//     refuses (stores/internal/errtest), as each store's TestErrorClasses
//     or TestOutageErrorClasses does.
//   - A README.md beside it (configuration, layout, errors, privileges,
//     bytes a record), and its row in the root README's table of stores.
//
// The programs (router_example, cmd/dedupctl) and the tests'
// anystore.OpenStore build every store from settings in one place: the
// registry of store kinds in internal/storeopen. A store is registered
// there as a Kind in a file of its own, internal/storeopen/<kind>.go
// (its -store name, its flags, how it connects, builds its store and is
// closed; memory.go, redis.go, sql.go and nats.go are the examples), a
// field for its settings in storeopen.Settings
// (internal/storeopen/settings.go), and one line in the kinds list of
// internal/storeopen/kinds.go. dedupctl then offers it (-store, its
// flags, their environment variables; window prints a row saying how to
// give its bytes a record), and anystore.OpenStore opens it by its name,
// StoreParams.Config carrying its Config.
//
// Four places name each store on purpose, and take a new one by hand:
//
//   - internal/testkit/anystore/stores.go: RequireStore's case for its test
//     service (the address, and the hint how to start it), and its
//     settings in StoreParams.settings;
//   - internal/storeopen/kinds_test.go: TestKinds pins the list of kinds;
//   - acceptance/stores_test.go: its entry in the broker × store matrix;
//   - router_example, if the demo is to run on it: storeNames in
//     config.go, and in stores.go the name of a run's records (runName)
//     and what -cleanup deletes;
//
// and cmd/dedupctl/window.go keeps its benchmark figure, once there is
// one.
package stores
