package amqptest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// AMQPSubscriber is a subscriber of any watermill-amqp major, made by
// newSub for the broker's URL, on a fresh queue named prefix plus an ID,
// initialized. The subscriber closes, then the queue goes, when t ends;
// without a broker t is skipped (or fails, as testkit.RequireAMQP says).
func AMQPSubscriber[S interface {
	message.Subscriber
	SubscribeInitialize(topic string) error
}](t *testing.T, prefix string, newSub func(url string) (S, error)) (url, queue string, sub S) {
	t.Helper()
	url = testkit.RequireAMQP(t)
	queue = prefix + storetest.NewID()
	sub, err := newSub(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	t.Cleanup(func() {
		if err := deleteAMQPQueues(url, queue); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	if err := sub.SubscribeInitialize(queue); err != nil {
		t.Fatal(err)
	}
	return url, queue, sub
}

// PublishForeignTwice is a producer that is not Watermill retrying: it
// publishes the same message twice to queue with amqp091, message_id
// order-42, a timestamp and a numeric header.
func PublishForeignTwice(t *testing.T, url, queue string) {
	t.Helper()
	ch := AMQPChannel(t, url)
	for range 2 {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp091.Publishing{
			MessageId: "order-42", Timestamp: time.Now(), Headers: amqp091.Table{"attempt": int32(1)}, Body: []byte(`{"order":42}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
}
