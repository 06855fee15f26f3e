package jsguard_test

import (
	"fmt"
	"testing"

	"github.com/watermill-dedup/dedup/internal/jsguard"
)

// TestSendOnClosedChannel: the guard recovers only the closed-channel
// send; any other panic of the callback goes on.
func TestSendOnClosedChannel(t *testing.T) {
	recovered := func(f func()) (r any) {
		defer func() { r = recover() }()
		f()
		return nil
	}
	if !jsguard.SendOnClosedChannel(recovered(func() {
		ch := make(chan int)
		close(ch)
		ch <- 1
	})) {
		t.Error("a send on a closed channel is not recognised")
	}
	for _, v := range []any{nil, "send on closed channel", fmt.Errorf("send on closed channel"), recovered(func() {
		var m map[string]int
		m["x"] = 1
	}), recovered(func() {
		ch := make(chan int)
		close(ch)
		close(ch)
	})} {
		if jsguard.SendOnClosedChannel(v) {
			t.Errorf("%v (%T) taken for a send on a closed channel", v, v)
		}
	}
}
