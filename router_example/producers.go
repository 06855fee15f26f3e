package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
	"github.com/watermill-dedup/dedup/middleware"
)

// producer publishes the planned messages to the topic. With
// -producer=watermill it is Watermill's publisher; with -producer=foreign
// the broker's own client, as a payments service written without Watermill
// (in another language, say) would publish: the messages carry no Watermill
// UUID header, and the consumer keys them by what the broker gives it
// instead (see consumerKeying).
type producer interface {
	// publish sends pm and returns the reference the consumer will know
	// the message by (messageRef), for the tracker.
	publish(ctx context.Context, topic string, pm plannedMessage) (ref string, err error)
}

// watermillProducer is Watermill's publisher: the UUID travels in
// Watermill's own header, the metadata in headers (or the metadata column).
type watermillProducer struct{ pub message.Publisher }

func (p watermillProducer) publish(ctx context.Context, topic string, pm plannedMessage) (string, error) {
	msg, err := pm.message()
	if err != nil {
		return "", err
	}
	msg.SetContext(ctx)
	return msg.UUID, p.pub.Publish(topic, msg)
}

// Foreign producers' descriptions, for the summary.
const (
	watermillProducerText = "watermill (Watermill's publisher: the message id travels in Watermill's UUID header)"
	kafkaForeignText      = "foreign (Sarama SyncProducer: record key = event_id, record timestamp = published_at, no Watermill UUID header)"
	amqpForeignText       = "foreign (amqp091: message_id property = the message id, timestamp property = published_at, an int header, no Watermill UUID header)"
	sqlForeignText        = "foreign (plain INSERTs: uuid column = the message id, published_at in the metadata column)"
)

// kafkaForeignProducer publishes records with Sarama alone: the record key
// is the event's id (so a republished event keeps its key, and its
// partition), the record timestamp is published_at, and there is no
// Watermill UUID header. It uses the same idempotent Sarama settings as
// the Watermill publisher.
type kafkaForeignProducer struct{ prod sarama.SyncProducer }

func newKafkaForeignProducer(brokers []string) (*kafkaForeignProducer, error) {
	cfg := kafkaProducerConfig()
	cfg.ClientID = "payments-producer"
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return nil, err
	}
	return &kafkaForeignProducer{prod: prod}, nil
}

func (p *kafkaForeignProducer) Close() error { return p.prod.Close() }

func (p *kafkaForeignProducer) publish(_ context.Context, topic string, pm plannedMessage) (string, error) {
	payload, err := json.Marshal(pm.event)
	if err != nil {
		return "", err
	}
	partition, offset, err := p.prod.SendMessage(&sarama.ProducerMessage{
		Topic:     topic,
		Key:       sarama.StringEncoder(pm.event.EventID),
		Value:     sarama.ByteEncoder(payload),
		Timestamp: pm.publishedAt,
		Headers: []sarama.RecordHeader{
			{Key: []byte(metaAttempt), Value: []byte(strconv.Itoa(pm.attempt))},
		},
	})
	if err != nil {
		return "", err
	}
	return kafkaRef(partition, offset), nil
}

// amqpForeignProducer publishes with amqp091 alone, on the default
// exchange to the topic's queue, with publisher confirms: the message id
// is the message_id property, published_at the timestamp property (whole
// seconds in AMQP), and the attempt an integer header, as other clients
// send them: watermill-amqp's own marshaler fails such a delivery,
// amqpkeys.Marshaler turns the header into the string "2".
type amqpForeignProducer struct {
	conn *amqp091.Connection
	ch   *amqp091.Channel
}

func newAMQPForeignProducer(url string) (*amqpForeignProducer, error) {
	conn, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(dialTimeout)})
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			err = fmt.Errorf("publisher confirms: %w", err)
		}
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &amqpForeignProducer{conn: conn, ch: ch}, nil
}

// Close closes the connection, and the channel with it.
func (p *amqpForeignProducer) Close() error { return p.conn.Close() }

func (p *amqpForeignProducer) publish(ctx context.Context, queue string, pm plannedMessage) (string, error) {
	payload, err := json.Marshal(pm.event)
	if err != nil {
		return "", err
	}
	confirm, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp091.Publishing{
		MessageId:    pm.uuid,
		Timestamp:    pm.publishedAt,
		Type:         pm.event.Type,
		AppId:        "payments",
		ContentType:  "application/json",
		DeliveryMode: amqp091.Persistent,
		Headers:      amqp091.Table{metaAttempt: int32(pm.attempt)},
		Body:         payload,
	})
	if err != nil {
		return "", err
	}
	acked, err := confirm.WaitContext(ctx)
	switch {
	case err != nil:
		return "", err
	case !acked:
		return "", fmt.Errorf("RabbitMQ refused message %s (nack)", pm.uuid)
	}
	return pm.uuid, nil
}

// sqlForeignProducer inserts rows into watermill-sql's messages table with
// plain SQL, as the keyfuncs/sqlkeys doc shows: the message id in uuid, the
// event in payload, published_at (and the customer and attempt) in the
// metadata column, a JSON object of strings. PostgreSQL's default schema
// also records the inserting transaction, which its subscriber orders by.
type sqlForeignProducer struct {
	db     *sql.DB
	insert string
}

// newSQLForeignProducer inserts into table, the messages table's quoted
// name ("watermill_" + topic with watermill-sql's default schema).
func newSQLForeignProducer(db *sql.DB, broker, table string) *sqlForeignProducer {
	insert := "INSERT INTO " + table + " (uuid, payload, metadata) VALUES (?, ?, ?)"
	if broker == brokerPostgres {
		insert = "INSERT INTO " + table + " (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())"
	}
	return &sqlForeignProducer{db: db, insert: insert}
}

func (p *sqlForeignProducer) publish(ctx context.Context, _ string, pm plannedMessage) (string, error) {
	payload, err := json.Marshal(pm.event)
	if err != nil {
		return "", err
	}
	metadata, err := json.Marshal(map[string]string{
		metaPublishedAt: pm.publishedAt.UTC().Format(time.RFC3339Nano),
		metaCustomerID:  pm.event.CustomerID,
		metaAttempt:     strconv.Itoa(pm.attempt),
	})
	if err != nil {
		return "", err
	}
	if _, err := p.db.ExecContext(ctx, p.insert, pm.uuid, string(payload), string(metadata)); err != nil {
		return "", err
	}
	return pm.uuid, nil
}

// messageRef names a delivered message for the tracker, the injected
// faults and the ledger: its UUID or, for a Kafka record published without
// Watermill's UUID header, its partition and offset (a run has one topic).
func messageRef(msg *message.Message) string {
	if msg.UUID != "" {
		return msg.UUID
	}
	partition, okP := kafka.MessagePartitionFromCtx(msg.Context())
	offset, okO := kafka.MessagePartitionOffsetFromCtx(msg.Context())
	if okP && okO {
		return kafkaRef(partition, offset)
	}
	return ""
}

func kafkaRef(partition int32, offset int64) string {
	return "kafka:" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10)
}

// foreignKeys is consumerKeys for -producer=foreign: what each broker
// carries when the producer is not Watermill, beside the payment key.
func foreignKeys(cfg Config, payment keyfuncs.KeyFunc) (keyfuncs.KeyFunc, func(*message.Message) (time.Time, bool)) {
	switch {
	case isKafkaBroker(cfg.Broker):
		// No UUID: the record key is the event's id (a Watermill
		// producer's record key is the customer id, which RecordKey must
		// never be used with).
		return keyfuncs.All(keyfuncs.Prefix("record:", kafkakeys.RecordKey()), payment), kafkakeys.PublishedAt
	case cfg.Broker == brokerAMQP:
		// amqpkeys.Marshaler made the message_id property the UUID.
		return keyfuncs.All(keyfuncs.Prefix("msg:", keyfuncs.MessageID()), payment), amqpkeys.PublishedAt
	default:
		// The SQL brokers: the row's uuid column is the UUID.
		return keyfuncs.All(keyfuncs.Prefix("msg:", keyfuncs.MessageID()), payment), middleware.MetadataTime(metaPublishedAt)
	}
}

// keysText says what consumerKeys keys by, for the summary.
func keysText(cfg Config) string {
	switch {
	case cfg.Producer != producerForeign:
		return "msg:<message id> + payment:<payment_id>; published_at from metadata"
	case isKafkaBroker(cfg.Broker):
		return "record:<Kafka record key> + payment:<payment_id>; published_at = the record timestamp (kafkakeys)"
	case cfg.Broker == brokerAMQP:
		return "msg:<AMQP message_id, via amqpkeys.Marshaler> + payment:<payment_id>; published_at = the AMQP timestamp (amqpkeys)"
	default:
		return "msg:<the row's uuid column> + payment:<payment_id>; published_at from the row's metadata column"
	}
}

// errNoForeignProducer is the start-up error for a broker without a client
// of its own; Config.Validate refuses the combination first.
var errNoForeignProducer = errors.New("-producer=foreign needs a broker with a client of its own (kafka, kafka-embedded, amqp, postgres, mysql)")
