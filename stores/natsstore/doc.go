// Package natsstore is the dedup store on NATS JetStream key-value
// buckets (nats.go's jetstream package): a store shared by every
// consumer process that reaches the same NATS system, kept on disk and
// replicated by JetStream.
//
// Each (scope, key) is one KV key (a 128-bit digest of the pair, see
// the README), whose value says processing (token, lease_until) or done
// (expires_at, data). Every change is a write conditional on the key's
// revision, the KV compare-and-set: a Claim creates a key at the
// revision it read (none, a purge marker, an expired record), and
// Complete, Release and Extend rewrite a record only at the revision at
// which they read it processing under their token. So a write never
// lands on a record that changed since it was read, and two consumers
// can never both hold a key.
//
// The store decides expiry itself, from the times in the value and its
// [stores.Clock]; consumers sharing a bucket must keep their clocks in
// sync (NTP), as with sqlstore. What removes a record some time after it
// stopped mattering depends on the server ([TTLMode]):
//
//   - nats-server 2.9 and 2.10 have no per-key TTL: the bucket's MaxAge
//     (the KV TTL) removes every record MaxAge after its last write
//     ([TTLBucket]), and MaxAge bounds the leases and retentions the
//     store accepts (see [Config.RequiredMaxAge]).
//   - nats-server 2.11 and later (JetStream API level 1): New creates
//     its buckets with per-message TTLs (LimitMarkerTTL, no MaxAge) and
//     gives each record a TTL of its own ([TTLPerKey]): a done record
//     its retention, a processing record its lease and one more lease,
//     each plus ClockSkew. Retentions are then bounded by the server
//     only. A bucket created without per-message TTLs (by an older
//     server, before an upgrade) keeps the store on its MaxAge.
//
// [Store.TTLMode] tells which one New picked, and New logs it. The
// README's version matrix says what is tested on which server.
//
// JetStream KV has no multi-key transaction. A Claim of several keys
// takes them one by one in a fixed order and gives back the ones it took
// when a later one turns out taken; see [Store.Claim] for the exact
// guarantee.
//
// A replicated bucket is read from its stream leader, so a read sees
// every write acknowledged before it; a single-replica one by direct
// gets. Config.Shards spreads the records over
// several buckets, whose leaders JetStream places on different servers
// of a cluster.
//
// The Store implements [stores.Admin] (Get, List, Delete, GetByID,
// DeleteByID, Stats, Purge; see admin.go): a record is known by its KV
// key only (its ID, which GetByID and DeleteByID take), so List cannot
// select a scope or a key prefix ([stores.ErrNotSupported]) and Stats
// does not count by scope. It does not implement [stores.Inbox].
//
// The README next to this file describes the layout, the bytes each
// record takes, the limits and clustering.
package natsstore
