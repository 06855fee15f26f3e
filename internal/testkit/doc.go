// Package testkit is this module's own kit for its tests, its acceptance
// suite, its example and its benchmarks. It is internal to this module:
// no library package imports it, and it makes no compatibility promise.
//
// It finds the services that integration tests run against and decides
// what happens when one is missing: the test fails, naming it and how to
// start it. It puts a TCP proxy a test controls between a client and a
// service (Proxy), waits for events (WaitFor, Eventually), counts what the
// claim cycle reports (Metrics), drives a store through outages
// (ReturnsDuringOutage, RouterOutage, FailOpenRun, RefusedCalls), runs
// the middleware on a gochannel router (DedupMiddleware, NewRouter,
// RunRouter, Publish) and stands in for a publisher or a store's calls
// (Recorder, HookStore).
//
// The kit is cut by what it imports, because a library package's tests
// are part of what a service's `go mod tidy` downloads (README,
// Footprint). This package imports only the standard library, Watermill
// and this module's library packages; what needs a client lives beside
// it, and a test imports only the parts for its own backend:
//
//   - redistest: Redis servers, clusters, TLS and ACL users of a test's own (go-redis)
//   - natstest: NATS servers and clusters, the Debian and the current nats-server (nats.go)
//   - sqltest: PostgreSQL clusters, least-privileged SQL roles, table cleanup (pgx, go-sql-driver/mysql)
//   - amqptest: RabbitMQ channels, queues and subscribers (amqp091-go)
//   - spantest: spans recorded in memory, and checks of the dedup spans (the OpenTelemetry SDK)
//   - anystore: any dedup store by kind, as the programs open them (every store and driver)
//   - keytest, ledger, base: key-function runs, the effect ledger (its SQL ledger: sqlstore and its drivers), and stdlib-only basics
//
// anystore is for tests that run on every store; they live outside the
// library packages (the acceptance suite, the onstores packages, the
// programs), so that no service downloads every store's client.
//
// Tests need PostgreSQL, MariaDB/MySQL, Redis, RabbitMQ and NATS on their
// standard loopback ports; the environment variables below override the
// addresses. A user who wants the tests of a missing service skipped
// instead sets DEDUP_SKIP_MISSING=1; with CI set (any non-empty value but
// false and 0) that is ignored: CI never goes green by skipping.
package testkit
