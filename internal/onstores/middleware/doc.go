// Package middleware holds the middleware's tests that run on every store
// on its real service (anystore, the stores' clients and drivers), apart
// from package middleware, whose own tests stay light: a library
// package's tests are part of what a service's `go mod tidy` downloads
// (README, Footprint). Nothing imports this package.
package middleware
