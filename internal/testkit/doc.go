// Package testkit is this module's own kit for its tests, its acceptance
// suite, its example and its benchmarks. It is internal to this module:
// no library package imports it, and it makes no compatibility promise.
//
// It finds the services that integration tests run against and decides
// what happens when one is missing: a loud skip on a developer's machine,
// a failure in CI. It opens any dedup store on them with one call
// (OpenStore, with its own StoreParams), keeps the exactly-once record of
// the effects a handler applies (Ledger: MemLedger, SQLLedger), and puts a
// TCP proxy a test controls between a client and a service (Proxy).
//
// Tests need PostgreSQL, MariaDB/MySQL, Redis and RabbitMQ on their standard
// loopback ports; the environment variables below override the addresses.
// When CI is set (any non-empty value) or DEDUP_REQUIRE_SERVICES=1, an
// unreachable service fails the test: CI must never go green by skipping.
package testkit
