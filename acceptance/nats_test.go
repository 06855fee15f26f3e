package acceptance_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/jsguard"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
)

// natsAckWait is the AckWait of every JetStream consumer: a delivery
// neither acked nor nacked within it (a killed or closed consumer's, or a
// handler's that outlived it) is delivered again, to any member of the
// group. Short, so a crashed consumer's messages come back quickly; a
// handler slower than that sees its message a second time, which the
// middleware drops or holds as in progress.
const natsAckWait = 5 * time.Second

// natsDuplicateWindow is the Duplicates window of every stream: how long
// JetStream drops a publish whose Nats-Msg-Id header it already stored
// (its publish dedup). The suite republishes messages under the same id
// on purpose, to test the middleware, so the streams keep the window at
// the server's minimum, 100ms (0 means the default, two minutes); see
// natsProducer for a republish inside it. router_example shows the
// broker's own dedup at work.
const natsDuplicateWindow = 100 * time.Millisecond

// Headers of the native producer's messages (see natsProducer).
const (
	natsSentAtHeader = "sent-at"     // the producer's publish time, RFC 3339
	natsSeqHeader    = "nats-seq"    // the stream sequence, set by natsUnmarshaler
	natsIDMetadata   = nats.MsgIdHdr // kept in the metadata by natsUnmarshaler
)

// natsJetStream is NATS JetStream through watermill-nats (its jetstream
// package): a stream per topic (limits retention, file storage) and a
// durable pull consumer per consumer group (named after the group,
// explicit acks, AckWait natsAckWait, unlimited MaxDeliver), whose
// subscribers pull one message at a time and compete. A nack is a Nak:
// the server redelivers at once. A delivery not acked within AckWait (a
// closed or killed subscriber's) is redelivered to the group.
func natsJetStream() acceptance.Backend {
	return natsJetStreamOn("nats-jetstream", func(t *testing.T) string { return testkit.RequireNATS(t) })
}

// natsJetStreamCurrent is natsJetStream on a nats-server of the current
// release (natstest.CurrentNATS) started for the scenario and killed at
// its end.
func natsJetStreamCurrent() acceptance.Backend {
	return natsJetStreamOn("nats-jetstream-current", func(t *testing.T) string { return natstest.CurrentNATS(t).Start(t, "").URL() })
}

// natsJetStreamOn is natsJetStream named name, on the server whose URL
// url returns for a scenario.
func natsJetStreamOn(name string, url func(t *testing.T) string) acceptance.Backend {
	return acceptance.Backend{
		Name: name,
		RaceUnsafe: "watermill-nats v2.1.3's jetstream subscriber closes its output channel when its context ends " +
			"while a message callback may be sending on it (pkg/jetstream consumer.go:158 against message_handler.go:52)",
		Features: acceptance.Features{
			ConsumerGroups: true,
			Persistent:     true,
			Restartable:    true,
			// Not Ordered: a Nak'd message comes back after later ones,
			// and the members of a group interleave. No shards: a
			// stream is consumed as a whole.
		},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			return acceptance.Env{"url": url(t)}, nil
		},
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			err := natsAdmin(env, func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{
					Name:       topic,
					Subjects:   []string{topic},
					Retention:  jetstream.LimitsPolicy,
					Storage:    jetstream.FileStorage,
					Duplicates: natsDuplicateWindow,
				})
				return err
			})
			if err != nil {
				return err
			}
			// Deleting the stream deletes its consumers.
			t.Cleanup(func() {
				err := natsAdmin(env, func(ctx context.Context, js jetstream.JetStream) error {
					return js.DeleteStream(ctx, topic)
				})
				if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Logf("nats cleanup: delete stream %s: %v", topic, err)
				}
			})
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			return wmjs.NewPublisher(wmjs.PublisherConfig{URL: env["url"], Logger: testLogger()})
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			return newNATSSubscriber(env, group, nil)
		},
		RemoveGroup: func(_ testing.TB, env acceptance.Env, topic, group string) error {
			err := natsAdmin(env, func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, topic, group)
			})
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil
			}
			return err
		},
		Deadline: &acceptance.Deadline{Name: fmt.Sprintf("JetStream AckWait %s (the server redelivers to any member, the subscriber stops waiting for the handler)", natsAckWait)},
		Native: &acceptance.Native{
			Client:       "nats.go jetstream PublishMsg with Nats-Msg-Id",
			NewPublisher: newNATSProducer,
			NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
				return newNATSSubscriber(env, group, natsUnmarshaler{})
			},
			// natsUnmarshaler: Nats-Msg-Id becomes the UUID of a message
			// without a Watermill UUID.
			Key:         keyfuncs.MessageID(),
			KeyName:     "keyfuncs.MessageID() (Nats-Msg-Id)",
			OtherKeys:   map[string]keyfuncs.KeyFunc{`keyfuncs.Metadata("` + natsIDMetadata + `")`: keyfuncs.Metadata(natsIDMetadata)},
			CopyKey:     keyfuncs.Metadata(natsSeqHeader),
			CopyKeyName: `keyfuncs.Metadata("` + natsSeqHeader + `") (stream sequence)`,
			PublishedAt: middleware.MetadataTime(natsSentAtHeader),
		},
	}
}

// newNATSSubscriber is a subscriber of the durable consumer named group,
// on a connection of its own that its Close drains.
func newNATSSubscriber(env acceptance.Env, group string, u wmjs.Unmarshaler) (message.Subscriber, error) {
	return wmjs.NewSubscriber(wmjs.SubscriberConfig{
		URL:    env["url"],
		Logger: testLogger(),
		// As long as the server waits: past it the server redelivers
		// anyway, and the subscriber stops waiting for the handler.
		AckWaitTimeout:      natsAckWait,
		ResourceInitializer: natsDurable(group),
		// One message at a time: a handler that hangs holds no buffered
		// message back from the other members.
		ConsumeOptions: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(1)},
		Unmarshaler:    u,
	})
}

// natsDurable creates (or joins) the durable consumer named group on the
// topic's stream.
func natsDurable(group string) wmjs.ResourceInitializer {
	return func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
		c, err := js.CreateOrUpdateConsumer(ctx, topic, jetstream.ConsumerConfig{
			Durable:       group,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       natsAckWait,
			MaxDeliver:    -1,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return nil, nil, err
		}
		// No closer: the group outlives any one member; RemoveGroup
		// deletes it. The guard: a member closing while messages
		// arrive must not end the process (see jsguard).
		return jsguard.Consumer{Consumer: c}, nil, nil
	}
}

// natsAdmin runs f on a JetStream context of a connection of its own.
func natsAdmin(env acceptance.Env, f func(context.Context, jetstream.JetStream) error) error {
	nc, err := nats.Connect(env["url"])
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f(ctx, js)
}

// natsProducer is a producer that is not Watermill: nats.go's jetstream
// PublishMsg, waiting for the stream's ack, with its id in the
// Nats-Msg-Id header (JetStream's publish dedup id), a content type and
// its time in a sent-at header. No Watermill UUID header.
type natsProducer struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newNATSProducer(_ testing.TB, env acceptance.Env) (acceptance.NativePublisher, error) {
	nc, err := nats.Connect(env["url"])
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return natsProducer{nc: nc, js: js}, nil
}

func (p natsProducer) Publish(topic string, m acceptance.NativeMessage) error {
	msg := nats.NewMsg(topic)
	msg.Data = m.Payload
	msg.Header.Set(nats.MsgIdHdr, m.ID)
	msg.Header.Set("content-type", "application/json")
	if !m.At.IsZero() {
		msg.Header.Set(natsSentAtHeader, m.At.Format(time.RFC3339Nano))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ack, err := p.js.PublishMsg(ctx, msg)
		if err != nil || !ack.Duplicate {
			return err
		}
		// JetStream's publish dedup dropped a republish of the same id
		// inside the Duplicates window: what the broker catches on its
		// own. The scenario needs every republish it plans to reach the
		// consumer, so publish it again once the window is over.
		select {
		case <-time.After(natsDuplicateWindow):
		case <-ctx.Done():
			return fmt.Errorf("republish %s: %w", m.ID, ctx.Err())
		}
	}
}

func (p natsProducer) Close() error { return p.nc.Drain() }

// natsUnmarshaler is watermill-nats' unmarshaler for messages of other
// producers: a message without a Watermill UUID header gets its
// Nats-Msg-Id as UUID, which also stays in the metadata (the default
// unmarshaler drops it), and every message gets its stream sequence in
// the nats-seq metadata: the same on every redelivery of one published
// copy, another for every copy.
type natsUnmarshaler struct{}

func (natsUnmarshaler) Unmarshal(msg jetstream.Msg) (*message.Message, error) {
	m, err := wmjs.DefaultUnmarshaler{}.Unmarshal(msg)
	if err != nil {
		return nil, err
	}
	if id := msg.Headers().Get(nats.MsgIdHdr); id != "" {
		m.Metadata.Set(natsIDMetadata, id)
		if msg.Headers().Get(wmnats.WatermillUUIDHdr) == "" {
			m.UUID = id
		}
	}
	md, err := msg.Metadata()
	if err != nil {
		return nil, err
	}
	m.Metadata.Set(natsSeqHeader, strconv.FormatUint(md.Sequence.Stream, 10))
	return m, nil
}
