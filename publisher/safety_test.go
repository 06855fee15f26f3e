package publisher_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// completeOnce wraps a store: its first Complete fails with err, after
// writing the record when landed is set (the reply lost on the way back).
type completeOnce struct {
	stores.Store
	err    error
	landed bool
	failed atomic.Bool
}

func (c *completeOnce) Complete(ctx context.Context, cl *stores.Claim, retention time.Duration, data []byte) error {
	if c.failed.CompareAndSwap(false, true) {
		if c.landed {
			if err := c.Store.Complete(ctx, cl, retention, data); err != nil {
				return err
			}
		}
		return c.err
	}
	return c.Store.Complete(ctx, cl, retention, data)
}

// TestCompleteAfterPublishIsRetried: after a successful publish, a
// Complete that fails with an error the store does not classify is
// retried (as in the consumer middleware): one blip must not leave the
// record processing for a producer retry after the lease to publish the
// message again. And a Complete whose reply was lost (it landed) is
// reconciled, not reported as a record that could not be written.
func TestCompleteAfterPublishIsRetried(t *testing.T) {
	for _, landed := range []bool{false, true} {
		name := map[bool]string{false: "failed", true: "reply lost"}[landed]
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			store := &completeOnce{Store: newMem(t, clock), err: errors.New("read tcp 127.0.0.1:50000->127.0.0.1:6379: read: connection reset by peer"), landed: landed}
			logger := watermill.NewCaptureLogger()
			rec := &recorder{}
			pub := decorate(t, publisher.Config{Store: store, Policy: dedup.Policy{Lease: time.Minute, Logger: logger}}, rec)
			if err := pub.Publish("t", msg("a", "")); err != nil {
				t.Fatal(err)
			}
			clock.Advance(2 * time.Minute) // past the lease, well inside the window
			if err := pub.Publish("t", msg("a", "")); err != nil {
				t.Fatal(err)
			}
			if n := len(rec.uuids()); n != 1 {
				t.Fatalf("published %d times, want 1", n)
			}
			if errs := logger.Captured()[watermill.ErrorLogLevel]; len(errs) != 0 {
				t.Errorf("logged %q, want nothing: the record was written", errs[0].Msg)
			}
		})
	}
}
