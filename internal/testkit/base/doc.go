// Package base holds the test helpers that import no store: an internal
// test file of a store package (package sqlstore, not sqlstore_test), or a
// test of a package the stores build on, can use them where it cannot
// import package testkit, which imports every store. Package testkit
// builds on it.
package base
