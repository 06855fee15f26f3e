// Package expiringkeys holds the expiringkeys Repository's tests that run
// on every store and on the real services: Watermill's Deduplicator
// tests, its comparison with the dedup middleware and publisher, store
// outages and the stores' bounds. They live here, not beside
// expiringkeys, because a service's `go mod tidy` downloads what the
// tests of every package it imports need, and users never import this
// package. The Repository's own tests
// (github.com/watermill-dedup/dedup/expiringkeys) run on memstore alone.
package expiringkeys
