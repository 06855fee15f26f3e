//go:build !race

// The race detector reports the send on the closed channel this test
// provokes as the data race it also is (inside watermill-nats): .ci/run
// runs it without -race, beside the NATS acceptance rows.

package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/jsguard"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// TestNATSSubscriberClosesWhileDelivering: closing watermill-nats'
// JetStream subscriber while messages stream in must not end the process
// with "send on closed channel" (it did, at the end of a run of the
// example, in CI). Each round subscribes to a stream full of messages,
// acks what it reads, then ends the Subscribe context mid-stream, as the
// router does when it closes; without jsguard.Consumer some round panics and
// the test binary dies.
func TestNATSSubscriberClosesWhileDelivering(t *testing.T) {
	url := testkit.RequireNATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	topic := fmt.Sprintf("dedup_guard_%d", os.Getpid())
	if _, err := js.CreateStream(ctx, natsStreamConfig(topic)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), natsStreamName(topic)) })
	for i := range 2000 {
		if _, err := js.PublishAsync(topic, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
	}
	logger := watermill.NopLogger{}
	rounds := 60
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		subConn, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
			Conn:   subConn,
			Logger: logger,
			ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
				// An ephemeral consumer: every round reads the stream
				// from its start.
				c, err := js.CreateOrUpdateConsumer(ctx, natsStreamName(topic), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
				if err != nil {
					return nil, nil, err
				}
				return jsguard.Consumer{Consumer: c, Logger: logger}, nil, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		// The router cancels the Subscribe context when it closes: the
		// subscriber then closes its output channel while nats.go still
		// runs the callback for the messages it fetched.
		subCtx, cancel := context.WithCancel(ctx)
		msgs, err := sub.Subscribe(subCtx, topic)
		if err != nil {
			t.Fatal(err)
		}
		// Read a varying number, acking each, then close mid-stream.
		for range 5 + round%17 {
			var m *message.Message
			select {
			case m = <-msgs:
			case <-t.Context().Done():
				t.Fatal("test ended")
			}
			m.Ack()
		}
		cancel()
		for range msgs { // until the subscriber closed it
		}
		if err := sub.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		subConn.Close()
	}
}
