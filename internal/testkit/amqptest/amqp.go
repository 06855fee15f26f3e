package amqptest

import (
	"errors"
	"fmt"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// DeleteAMQP runs del on a channel of a connection of its own to the
// RabbitMQ at url, and closes both: for a test's cleanup of its queues
// and exchanges.
func DeleteAMQP(url string, del func(ch *amqp091.Channel) error) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return del(ch)
}

// deleteAMQPQueues deletes the queues (whether or not they are empty or
// in use) and returns what failed.
func deleteAMQPQueues(url string, queues ...string) error {
	return DeleteAMQP(url, func(ch *amqp091.Channel) error {
		var errs []error
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
			}
		}
		return errors.Join(errs...)
	})
}

// AMQPChannel returns a channel of a connection of its own to the
// RabbitMQ at url; both are closed when t ends.
func AMQPChannel(t testing.TB, url string) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}
