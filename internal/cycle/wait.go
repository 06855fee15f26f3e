package cycle

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
)

// Await waits, after a claim found the keys of msg held by another run,
// for that run to end: it calls again every InProgressPoll (give or take
// half, so that waiting producers do not claim in step) until again
// reports the keys free (busy false) or fails, for up to InProgressWait.
// It returns again's error; dedup.ErrInProgress (counted) when the wait
// ended with the keys still held; or, when msg's context ends first, an
// error wrapping the context's (counted as cancelled). With a zero
// InProgressWait it returns ErrInProgress at once.
func (c *Cycle) Await(msg *message.Message, scope string, keys []string, again func() (busy bool, err error)) error {
	ctx := msg.Context()
	deadline := time.Now().Add(c.p.InProgressWait)
	poll := c.p.Tuning.InProgressPoll
	for {
		// At least a nanosecond: a 1ns poll (half of it is 0) waits.
		wait := min(max(poll/2+rand.N(poll), 1), time.Until(deadline))
		if wait <= 0 {
			return c.InProgress(msg, scope, keys)
		}
		if !sleepCtx(ctx, wait) {
			c.Observe(scope, dedup.OutcomeCancelled)
			return c.Errorf(msg, scope, "its context ended while it waited for another run holding its keys: %w", context.Cause(ctx))
		}
		busy, err := again()
		if err != nil || !busy {
			return err
		}
	}
}

// sleepCtx sleeps for d, or until ctx is done (then it returns false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
