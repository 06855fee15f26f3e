// Package amqpkeys keys messages consumed from RabbitMQ (AMQP 0-9-1) with
// watermill-amqp v2 (github.com/ThreeDotsLabs/watermill-amqp/v2) by the
// delivery's own identity, so that messages published by producers that
// are not Watermill can be deduplicated. For watermill-amqp v3 use
// github.com/watermill-dedup/dedup/keyfuncs/amqpkeys/v3: the same API on
// v3's marshalers, with the same metadata and keys.
//
// A Watermill publisher writes the message UUID in a header of its own
// (_watermill_message_uuid). Other producers set the AMQP message_id
// property instead, as RabbitMQ's documentation advises, and
// watermill-amqp's default marshaler drops every property: such a message
// reaches the handler with an empty UUID and nothing to key it by. Use
// [Marshaler] as the subscriber's marshaler:
//
//	cfg := amqp.NewDurableQueueConfig(url)
//	cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
//
// It carries message_id, correlation_id, timestamp, app_id and type into
// the message's metadata (see the Metadata constants) and uses message_id
// as the message UUID when the Watermill header is absent, so the
// middleware's default key, keyfuncs.MessageID(), works unchanged. Key by
// business fields as well with keyfuncs.All, since a producer that
// republishes an event usually gives it a new message_id.
//
// It is a separate package so that importing keyfuncs does not pull the
// AMQP client into every build, and each major has its own, so that a
// build compiles only the major it uses.
package amqpkeys
