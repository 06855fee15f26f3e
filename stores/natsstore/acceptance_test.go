package natsstore_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/testkit"
)

// TestAcceptance runs every scenario of the acceptance suite on
// Watermill's gochannel with natsstore in a bucket of each scenario's
// own, the outage scenario through the suite's proxy, and logs the
// summary table.
func TestAcceptance(t *testing.T) {
	testkit.RequireNATS(t)
	t.Cleanup(func() {
		var b bytes.Buffer
		acceptance.WriteSummary(&b)
		t.Log("\n" + b.String())
	})
	acceptance.Run(t, goChannel(), natsAcceptanceStore())
}

// natsAcceptanceStore is natsstore on the test NATS server, in a bucket
// unique to the scenario, deleted at its end. Every Open dials
// env[EnvAddr], the server or the outage scenario's proxy.
func natsAcceptanceStore() acceptance.Store {
	return acceptance.Store{
		Name:         "nats",
		MultiProcess: true,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			testkit.RequireNATS(t)
			cfg := natsstore.Config{Bucket: "acceptance_" + id}
			deleteBuckets(t, sharedConn(t), cfg)
			return acceptance.Env{acceptance.EnvAddr: testkit.NATSAddr(), "bucket": cfg.Bucket}, nil
		},
		Open: func(t testing.TB, env acceptance.Env) (acceptance.Opened, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			s, err := natsstore.Connect(ctx, "nats://"+env[acceptance.EnvAddr], natsstore.Config{Bucket: env["bucket"]},
				nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(time.Second),
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			if err != nil {
				return acceptance.Opened{}, err
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			return acceptance.Opened{Store: s}, nil
		},
	}
}

// gochannels holds the pub/sub of each running scenario: gochannel lives
// in the test process only, so its Env just names it.
var gochannels sync.Map

// goChannel is Watermill's in-process pub/sub, as the acceptance suite
// runs it: no consumer groups (every subscriber gets every message),
// nothing survives a subscriber, not reachable from another process.
func goChannel() acceptance.Backend {
	lookup := func(env acceptance.Env) (*gochannel.GoChannel, error) {
		ps, ok := gochannels.Load(env["gochannel"])
		if !ok {
			return nil, fmt.Errorf("no gochannel %q", env["gochannel"])
		}
		return ps.(*gochannel.GoChannel), nil
	}
	return acceptance.Backend{
		Name: "gochannel",
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

// sharedGoChannel is one scenario's GoChannel, closed by the scenario,
// not by each publisher and subscriber.
type sharedGoChannel struct{ *gochannel.GoChannel }

func (sharedGoChannel) Close() error { return nil }
