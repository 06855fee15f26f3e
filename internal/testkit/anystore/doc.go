// Package anystore opens any dedup store by kind for a test, as the
// programs open them (through internal/storeopen). It imports every
// store, every SQL driver (SQLite included) and every client: only tests
// that run on every store import it, and none of them lives in a library
// package.
package anystore
