// Package batch coalesces concurrent calls into batches (group commit)
// without adding latency to a lone caller.
//
// A call that arrives while nothing else is running runs at once, alone,
// in the caller's goroutine. A call that arrives while other calls are out
// waits in a queue. If one of the MaxInFlight slots is free, the caller
// takes it at once and, after one yield of the processor (so that
// callers just woken by a finished batch can queue their next calls and
// go out together, instead of one by one), sends everything queued as one
// batch: alone, in its own goroutine, if nobody joined it; else through a
// worker goroutine, so that each caller can leave at its own deadline. If
// every slot is busy, the queue goes out when a batch
// finishes: that batch's worker takes it (up to MaxBatch calls a batch)
// and goes on until the queue is empty, then frees its slot. A lone
// caller runs immediately, and under load the batch size grows by itself
// to match the backend's round-trip time. This is the group commit of
// databases, and the way a pipeline reaches a store's pipelined rate.
//
// A call nobody waits for on a message's path (a background write) can
// instead be sent with [Batcher.DoLater]: it does not go out alone while
// another call may soon come to carry it. It goes out with the next call
// sent with Do (in its batch, or taken along by it), and only when none
// comes within its linger does it go out on its own. On a sequential
// consumer that halves the round trips: the record of one message goes
// out with the claim of the next.
//
// # Contexts and deadlines
//
// Every call keeps its own context, and no queued call waits past it:
//
//   - A call whose context is already done returns its error at once, and
//     a batch skips the calls whose context is done by the time it starts.
//   - A queued call whose context ends leaves the queue and returns its
//     error. One whose context ends while its batch is running returns its
//     error at once too; the batch carries on without it, and its result,
//     if it gets one, goes to the OnOrphaned undo.
//   - A lone call running in its caller's goroutine (nothing else out,
//     or a free slot that nobody joined) runs under its own context,
//     exactly as an unbatched call: it returns when the backend honours
//     that context.
//   - A call that finds nothing out but calls sent with DoLater waiting
//     takes them along: it runs their batch in its own goroutine when its
//     deadline is the batch's (no call's is later, and it has one), so it
//     returns by its deadline, but not before the batch ends when it is
//     cancelled sooner; else through a worker, as below.
//   - A batch of one call runs under that call's context. A batch of
//     several runs under a context that carries the values of its first
//     call's context, is not cancelled when one caller gives up (one
//     caller's cancellation must not fail the others), and has the latest
//     deadline of its calls, or none if one of them has none. So a backend
//     that honours deadlines ends every batch by the deadline of the
//     longest-waiting caller it serves, and a stuck backend holds a slot
//     no longer than that.
package batch
