package acceptance_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/testenv"
)

// rabbitMQ is RabbitMQ through watermill-amqp: a durable fanout exchange
// per topic and a durable queue per consumer group (topic_group), whose
// consumers compete; a nack requeues. Unacked messages of a closed or
// killed consumer go back to the queue.
func rabbitMQ() acceptance.Backend {
	config := func(env acceptance.Env, group string) amqp.Config {
		c := amqp.NewDurablePubSubConfig(env["url"], amqp.GenerateQueueNameTopicNameWithSuffix(group))
		return c
	}
	return acceptance.Backend{
		Name: "rabbitmq",
		Features: acceptance.Features{
			ConsumerGroups: true,
			Persistent:     true,
			Restartable:    true,
			// Not Ordered: a requeued message may come back after later
			// ones, and competing consumers interleave.
		},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			return acceptance.Env{"url": testenv.RequireAMQP(t)}, nil
		},
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			// The publisher and subscribers declare the exchange; remove
			// it at the end.
			t.Cleanup(func() {
				if err := amqpDelete(env, func(ch *amqp091.Channel) error {
					return ch.ExchangeDelete(topic, false, false)
				}); err != nil {
					t.Logf("rabbitmq cleanup: delete exchange %s: %v", topic, err)
				}
			})
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			return amqp.NewPublisher(config(env, ""), testLogger())
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			return amqp.NewSubscriber(config(env, group), testLogger())
		},
		RemoveGroup: func(_ testing.TB, env acceptance.Env, topic, group string) error {
			name := amqp.GenerateQueueNameTopicNameWithSuffix(group)(topic)
			return amqpDelete(env, func(ch *amqp091.Channel) error {
				_, err := ch.QueueDelete(name, false, false, false)
				return err
			})
		},
	}
}

// amqpDelete runs del on a channel of its own connection.
func amqpDelete(env acceptance.Env, del func(*amqp091.Channel) error) error {
	conn, err := amqp091.Dial(env["url"])
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return errors.Join(del(ch))
}
