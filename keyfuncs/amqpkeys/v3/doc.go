// Package amqpkeys keys messages consumed from RabbitMQ (AMQP 0-9-1) with
// watermill-amqp v3 (github.com/ThreeDotsLabs/watermill-amqp/v3) by the
// delivery's own identity, so that messages published by producers that
// are not Watermill can be deduplicated. It is
// github.com/watermill-dedup/dedup/keyfuncs/amqpkeys (for watermill-amqp
// v2) on v3's marshalers: the same [Marshaler], [MessageID], [PublishedAt]
// and metadata names, giving the same keys, so consumers may move from v2
// to v3 without their records changing meaning. It compiles nothing of
// v2.
//
// Other producers set the AMQP message_id property, as RabbitMQ's
// documentation advises, and watermill-amqp's default marshaler drops
// every property: such a message reaches the handler with an empty UUID
// and nothing to key it by. Use [Marshaler] as the subscriber's
// marshaler:
//
//	cfg := amqp.NewDurableQueueConfig(url)
//	cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
//
// It carries message_id, correlation_id, timestamp, app_id and type into
// the message's metadata and uses message_id as the message UUID when the
// Watermill header is absent, so the middleware's default key,
// keyfuncs.MessageID(), works unchanged; it turns header values that are
// not strings (which v3's default marshaler, like v2's, fails the
// delivery on) into strings, and drops headers named like the metadata it
// writes. keyfuncs/amqpkeys documents each of them. Key by business
// fields as well with keyfuncs.All, since a producer that republishes an
// event usually gives it a new message_id.
//
// watermill-amqp v3's subscriber sets metadata of its own after the
// marshaler ran (_watermill_amqp_redelivered on a redelivery): none of
// the keys here read it.
package amqpkeys
