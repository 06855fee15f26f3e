package middleware

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// A background Complete's context keeps the message's values, not its
// cancellation (the subscriber may cancel it after the ack), and ends
// when Close gives up: itself, what derives from it, and its cause. It
// carries Tuning.CompleteLinger to the store.
func TestCompleteCtx(t *testing.T) {
	type k struct{}
	msgCtx, cancelMsg := context.WithCancelCause(context.WithValue(context.Background(), k{}, "v"))
	stop, giveUp := context.WithCancel(context.Background())
	linger := stores.WithLinger(context.Background(), time.Millisecond)
	c := &completeCtx{values: context.WithoutCancel(msgCtx), stop: stop, linger: linger}
	cancelMsg(errors.New("acked"))
	if c.Err() != nil || context.Cause(c) != nil {
		t.Fatalf("after the message's cancellation: Err %v, Cause %v; want none", c.Err(), context.Cause(c))
	}
	if c.Value(k{}) != "v" {
		t.Fatalf("the message's value: %v", c.Value(k{}))
	}
	// The store sees the linger (Tuning.CompleteLinger), through what
	// derives from it too.
	timed, stopTimed := context.WithTimeout(c, time.Hour)
	defer stopTimed()
	if got := stores.Linger(timed); got != time.Millisecond {
		t.Fatalf("stores.Linger = %s, want 1ms", got)
	}
	if _, ok := c.Deadline(); ok {
		t.Fatal("a deadline")
	}
	child, stopChild := context.WithTimeout(c, time.Hour)
	defer stopChild()
	if child.Err() != nil {
		t.Fatalf("child: %v", child.Err())
	}
	giveUp()
	<-child.Done()
	if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("after Close gave up: Err %v, Cause %v, child %v", c.Err(), context.Cause(c), child.Err())
	}
}
