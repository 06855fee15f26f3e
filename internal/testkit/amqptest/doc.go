// Package amqptest opens RabbitMQ channels for a test, deletes the queues
// it made, and runs the key-function checks of the AMQP majors. It
// imports amqp091-go and testkit only.
package amqptest
