// Package testkit is this module's own kit for its tests, its acceptance
// suite, its example and its benchmarks. It is internal to this module:
// no library package imports it, and it makes no compatibility promise.
//
// It finds the services that integration tests run against and decides
// what happens when one is missing: the test fails, naming it and how to
// start it. It opens any dedup store on them with one call
// (OpenStore, with its own StoreParams), keeps the exactly-once record of
// the effects a handler applies (Ledger: MemLedger, SQLLedger), and puts a
// TCP proxy a test controls between a client and a service (Proxy).
//
// Tests need PostgreSQL, MariaDB/MySQL, Redis and RabbitMQ on their standard
// loopback ports; the environment variables below override the addresses.
// A user who wants the tests of a missing service skipped instead sets
// DEDUP_SKIP_MISSING=1; with CI set (any non-empty value) that is ignored:
// CI never goes green by skipping.
package testkit
