// Package dedup holds what the dedup middleware
// ([github.com/watermill-dedup/dedup/middleware]) and the publisher
// decorator ([github.com/watermill-dedup/dedup/publisher]) share: the
// settings both take ([Policy]), the errors both return, and the outcomes
// and store latencies both report ([Metrics]).
//
// Both run one claim cycle around an effect — a handler on the consumer
// side, a publish on the producer side:
//
//  1. Claim the message's keys in a store, under a lease, bounded by
//     StoreTimeout. A store error follows OnStoreError.
//  2. Duplicate: skip the effect. InProgress: wait up to InProgressWait
//     for the other run, then fail with ErrInProgress.
//  3. Claimed: run the effect, extending the lease every
//     Tuning.Heartbeat.
//  4. The effect failed: release the claim, so a retry can run it.
//  5. It succeeded: record the message done for Retention. Every failure
//     of that record that is not known to be permanent is retried for
//     Tuning.CompleteTimeout, whatever becomes of the message's context:
//     the effect has happened, and a record left processing would let a
//     duplicate arriving after the lease run it again.
//
// Before any of this, New refuses a configuration the store cannot honour
// (a Lease or Retention beyond its stores.Capabilities, a mode it does not
// support), naming both values: a limit found only after the effect is a
// doubled effect.
package dedup
