package acceptance_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/amqptest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
)

// rabbitMQ is RabbitMQ through watermill-amqp: a durable fanout exchange
// per topic and a durable queue per consumer group (topic_group), whose
// consumers compete; a nack requeues. Unacked messages of a closed or
// killed consumer go back to the queue. This is watermill-amqp v2;
// rabbitMQ3 is v3.
func rabbitMQ() acceptance.Backend { return rabbitMQOf(amqpV2) }

// amqpClients are the clients of one watermill-amqp major.
type amqpClients struct {
	name string
	// newPublisher and newSubscriber (of group) are on the durable pub/sub
	// configuration (a fanout exchange per topic, a queue per group);
	// foreign: set up for the native producer's messages (amqpkeys'
	// marshaler); consumerTimeout, when positive, is the queue's
	// x-consumer-timeout (RabbitMQ 3.12 and later).
	newPublisher  func(url string) (message.Publisher, error)
	newSubscriber func(url, group string, foreign bool, consumerTimeout time.Duration) (message.Subscriber, error)
	// queue is the name of group's queue of topic.
	queue func(topic, group string) string
	// messageID and publishedAt are amqpkeys' of the major.
	messageID   keyfuncs.KeyFunc
	publishedAt func(*message.Message) (time.Time, bool)
}

var amqpV2 = amqpClients{
	name: "rabbitmq",
	newPublisher: func(url string) (message.Publisher, error) {
		return amqp.NewPublisher(amqp.NewDurablePubSubConfig(url, amqp.GenerateQueueNameTopicNameWithSuffix("")), testLogger())
	},
	newSubscriber: func(url, group string, foreign bool, consumerTimeout time.Duration) (message.Subscriber, error) {
		c := amqp.NewDurablePubSubConfig(url, amqp.GenerateQueueNameTopicNameWithSuffix(group))
		if foreign {
			c.Marshaler = amqpkeys.Marshaler{Inner: c.Marshaler}
		}
		if consumerTimeout > 0 {
			c.Queue.Arguments = amqp091.Table{"x-consumer-timeout": consumerTimeout.Milliseconds()}
		}
		return amqp.NewSubscriber(c, testLogger())
	},
	queue:       func(topic, group string) string { return amqp.GenerateQueueNameTopicNameWithSuffix(group)(topic) },
	messageID:   amqpkeys.MessageID(),
	publishedAt: amqpkeys.PublishedAt,
}

// rabbitMQOf is rabbitMQ on the clients of c.
func rabbitMQOf(c amqpClients) acceptance.Backend {
	return acceptance.Backend{
		Name: c.name,
		Features: acceptance.Features{
			ConsumerGroups: true,
			Persistent:     true,
			Restartable:    true,
			// Not Ordered: a requeued message may come back after later
			// ones, and competing consumers interleave.
		},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			return acceptance.Env{"url": testkit.RequireAMQP(t)}, nil
		},
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			// The publisher and subscribers declare the exchange; remove
			// it at the end.
			t.Cleanup(func() {
				if err := amqptest.DeleteAMQP(env["url"], func(ch *amqp091.Channel) error {
					return ch.ExchangeDelete(topic, false, false)
				}); err != nil {
					t.Logf("rabbitmq cleanup: delete exchange %s: %v", topic, err)
				}
			})
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			return c.newPublisher(env["url"])
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			return c.newSubscriber(env["url"], group, false, consumerTimeoutOf(env))
		},
		RemoveGroup: func(_ testing.TB, env acceptance.Env, topic, group string) error {
			name := c.queue(topic, group)
			return amqptest.DeleteAMQP(env["url"], func(ch *amqp091.Channel) error {
				_, err := ch.QueueDelete(name, false, false, false)
				return err
			})
		},
		Deadline: &acceptance.Deadline{Name: "RabbitMQ consumer timeout", Prepare: amqpDeadline},
		Native: &acceptance.Native{
			Client:       "amqp091 with publisher confirms",
			NewPublisher: newAMQPProducer,
			// amqpkeys.Marshaler: message_id becomes the UUID, the
			// properties become metadata, non-string headers strings.
			NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
				return c.newSubscriber(env["url"], group, true, consumerTimeoutOf(env))
			},
			Key:         keyfuncs.MessageID(),
			KeyName:     "keyfuncs.MessageID()",
			OtherKeys:   map[string]keyfuncs.KeyFunc{"amqpkeys.MessageID()": c.messageID},
			PublishedAt: c.publishedAt,
		},
	}
}

// amqpProducer is a producer that is not Watermill: amqp091 on a channel
// in confirm mode, publishing to the topic's fanout exchange (declared as
// watermill-amqp declares it) with the message_id, timestamp, app_id,
// type and content_type properties, and headers of AMQP's own types
// (numbers, a boolean, a timestamp, bytes) on every other message, none
// on the rest. No Watermill UUID header.
type amqpProducer struct {
	conn     *amqp091.Connection
	ch       *amqp091.Channel
	mu       sync.Mutex
	declared map[string]bool
	n        int
}

func newAMQPProducer(_ testing.TB, env acceptance.Env) (acceptance.NativePublisher, error) {
	conn, err := amqp091.Dial(env["url"])
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &amqpProducer{conn: conn, ch: ch, declared: map[string]bool{}}, nil
}

func (p *amqpProducer) Publish(topic string, m acceptance.NativeMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.declared[topic] {
		if err := p.ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
			return err
		}
		p.declared[topic] = true
	}
	p.n++
	pub := amqp091.Publishing{
		MessageId:    m.ID,
		Timestamp:    m.At,
		AppId:        "billing",
		Type:         "payment.captured",
		ContentType:  "application/json",
		DeliveryMode: amqp091.Persistent,
		Body:         m.Payload,
	}
	if p.n%2 == 1 {
		pub.Headers = amqp091.Table{
			"attempt":        int32(1),
			"schema_version": int64(3),
			"replayable":     true,
			"score":          float64(1.5),
			"trace":          []byte("00-" + m.ID),
		}
		if !m.At.IsZero() {
			pub.Headers["sent_at"] = m.At
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, topic, "", false, false, pub)
	if err != nil {
		return err
	}
	acked, err := conf.WaitContext(ctx)
	switch {
	case err != nil:
		return err
	case !acked:
		return fmt.Errorf("rabbitmq nacked message %s", m.ID)
	}
	return nil
}

func (p *amqpProducer) Close() error { return errors.Join(p.ch.Close(), p.conn.Close()) }
