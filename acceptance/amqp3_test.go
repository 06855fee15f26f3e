package acceptance_test

import (
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/acceptance"
	amqpkeys "github.com/watermill-dedup/dedup/keyfuncs/amqpkeys/v3"
)

// rabbitMQ3 is rabbitMQ on watermill-amqp v3, with the same durable
// pub/sub configuration (a fanout exchange per topic, a queue per
// consumer group) and amqpkeys/v3's marshaler for the native producer's
// messages. v3's subscriber marks a redelivered message in its metadata;
// nothing the suite keys by reads it.
func rabbitMQ3() acceptance.Backend { return rabbitMQOf(amqpV3) }

var amqpV3 = amqpClients{
	name: "rabbitmq-v3",
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
