package acceptance_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/dedup/acceptance"
)

// gochannels holds the pub/sub of each running scenario: gochannel lives
// in the test process only, so its Env just names it.
var gochannels sync.Map

// goChannel is Watermill's in-process pub/sub: no consumer groups (every
// subscriber gets every message), nothing survives a subscriber, not
// reachable from another process.
func goChannel() acceptance.Backend {
	lookup := func(env acceptance.Env) (*gochannel.GoChannel, error) {
		ps, ok := gochannels.Load(env["gochannel"])
		if !ok {
			return nil, fmt.Errorf("no gochannel %q", env["gochannel"])
		}
		return ps.(*gochannel.GoChannel), nil
	}
	return acceptance.Backend{
		Name:     "gochannel",
		Deadline: &acceptance.Deadline{None: "gochannel has no deadline for a delivery: it waits for the ack (or the subscriber's end) for ever"},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			id := watermill.NewShortUUID()
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, watermill.NopLogger{})
			gochannels.Store(id, ps)
			t.Cleanup(func() {
				gochannels.Delete(id)
				_ = ps.Close()
			})
			return acceptance.Env{"gochannel": id}, nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			ps, err := lookup(env)
			return sharedGoChannel{ps}, err
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, _ string) (message.Subscriber, error) {
			ps, err := lookup(env)
			return sharedGoChannel{ps}, err
		},
	}
}

// sharedGoChannel is one scenario's GoChannel, closed by the scenario, not
// by each publisher and subscriber.
type sharedGoChannel struct{ *gochannel.GoChannel }

func (sharedGoChannel) Close() error { return nil }
