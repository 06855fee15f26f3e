// Package redisstore is the dedup store on Redis (go-redis/v9): the fast,
// shared store for consumers running in many processes.
//
// Every record is one Redis string with a PX expiry, so leases and retention
// need no sweeper, and every operation is one atomic command on the server:
// a Lua script, or a plain SET for the common single-key claim (see
// [Store.Claim]). Time is the server's: leases are checked against the
// key's remaining TTL, never against a client clock.
//
// Concurrent calls share pipelines (auto-batching, on by default; see
// [BatchConfig]), each call with its own result and its own deadline.
//
// It works unchanged with [*redis.Client] (standalone, or Sentinel through
// redis.NewFailoverClient), [*redis.ClusterClient] and [*redis.Ring]. On a
// single node a claim of several keys is one atomic script. In Redis Cluster
// the keys of one claim (message id, business key) usually hash to
// different slots, so the store claims them one by one in a fixed order and
// undoes the ones it took when a later one is not free; see [Store.Claim]
// for the guarantee. A CROSSSLOT error never reaches the caller.
//
// Redis replicates asynchronously: a failover may lose the writes a
// master acknowledged last, done records and claims among them. With
// Config.WaitReplicas a write succeeds only once that many replicas of
// its node have it (WAIT, one per pipeline and node), and fails with
// [ErrNotReplicated] otherwise; the README says what it guarantees and
// what it costs.
//
// Redis must not evict dedup records: run it with maxmemory-policy
// noeviction. The store checks the policy when it starts and logs an error
// when the server would evict live records (see [Store.CheckServer]).
//
// The Store implements [stores.Admin], which the dedupctl command uses:
// List and Stats SCAN the keys under the prefix on every node. The
// default layout keeps each record's scope and key readable, so records
// are listed and counted by scope (but for keys stored as digests, whose
// key is unknown); with CompactKeys they are known by their Redis key
// only, and a List by scope or key prefix fails with
// [stores.ErrNotSupported]. Keys under the prefix that are not the
// store's records (another layout's, another program's, those
// Config.Foreign names, such as another store's under a longer prefix)
// are passed over, and Stats counts them in Skipped.
//
// The README next to this file describes the key layout, the memory each
// record takes and how to size Redis for a message rate and window.
package redisstore
