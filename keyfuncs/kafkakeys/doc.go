// Package kafkakeys keys messages consumed with watermill-kafka by the
// Kafka record's own identity: its coordinates ([KafkaOffset]) and its key
// ([RecordKey]), and reads its timestamp ([PublishedAt]). It is a separate
// package so that importing keyfuncs does not pull Sarama into every build.
//
// A record published by a producer that is not Watermill has no Watermill
// UUID (watermill-kafka reads it from a header of its own), so the
// middleware's default key, keyfuncs.MessageID(), cannot key it. Key such
// records by KafkaOffset (catches redelivery of the same record), by
// RecordKey or a header the producer sets (keyfuncs.Metadata: record
// headers arrive as metadata) when those identify the event, or by
// business fields of the payload (keyfuncs.JSON), and combine them with
// keyfuncs.All.
package kafkakeys
