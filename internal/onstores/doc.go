// Package onstores holds, in its subpackages, the library's tests that
// run on every store or broker: the middleware's (middleware), the
// publisher's (publisher), the Deduplicator repository's (expiringkeys)
// and sqlstore's on SQLite and with watermill-sql (sqlstore). They are
// test-only packages that no service imports, so what they import is
// not downloaded by a service's go mod tidy (README, Footprint); its own
// test checks that the library packages' tests stay so.
package onstores
