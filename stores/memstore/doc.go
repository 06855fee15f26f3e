// Package memstore is the embedded, single-process dedup store: records live
// in the Go heap, in sharded hash tables, and vanish with the process.
//
// Use it for tests, for the embedded demo, and for consumers where one
// process is the only consumer of a queue and a restart may legitimately
// forget what was done (a restart also loses every record, so a redelivery
// after a crash runs the handler again). For anything shared by several
// processes or surviving restarts use redisstore or sqlstore.
//
// # Keys
//
// A record is stored under a 128-bit hash of its (scope, key), not under
// the key itself (see Store.hash): a record costs no allocation and holds
// no pointer, so millions of records cost the garbage collector nothing
// to scan. Two different keys would be taken for one only on a 128-bit
// collision: with n live records the chance that a new key collides with
// any of them is n/2^128 (about 3e-30 at a billion records).
//
// The Store implements [stores.Admin]. Since a record keeps no scope or
// key, List lists records by their hash (the ID, which GetByID and
// DeleteByID take) and cannot select a scope or a key prefix, and Stats
// does not count by scope.
//
// # Memory
//
// Each shard keeps its records in an open-addressing table of 32-byte
// slots (the hash and the record), filled to between 3/8 and 3/4 before
// it doubles: 43 to 85 bytes per done record, 67 at one million records
// (BenchmarkMemoryPerRecord), plus any data (produced messages) kept with
// it. A lookup is usually one cache miss. The background sweeper removes
// expired records every SweepInterval, so the heap holds at most
// (messages per second) x (retention + SweepInterval) records; a table
// does not shrink.
package memstore
