// Package publisher holds the publisher's tests that run on every store
// and broker: producers sharing a store on gochannel, Kafka, RabbitMQ and
// watermill-sql, and the transactional outbox on PostgreSQL and MySQL
// with watermill-sql v3 and v4. They live here, not beside the publisher,
// because a service's `go mod tidy` downloads what the tests of every
// package it imports need, and users never import this package. The
// publisher's own tests (github.com/watermill-dedup/dedup/publisher) run
// on memstore alone.
package publisher
