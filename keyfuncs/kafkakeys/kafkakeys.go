package kafkakeys

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

// KafkaOffset keys a message by "topic/partition/offset", read from the
// context values watermill-kafka's subscriber sets (the topic from the
// router's subscribe topic). The triple identifies one record of one log, so
// it catches broker redelivery after a crash, a rebalance or a seek; it does
// not catch a producer that republishes an event (a new offset), and it
// changes meaning if a topic is deleted and recreated. Combine it with a
// business key using keyfuncs.All.
//
// A message without those context values (not consumed from Kafka, or
// outside a router) gives an error wrapping keyfuncs.ErrNoKey.
func KafkaOffset() keyfuncs.KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		ctx := msg.Context()
		topic := message.SubscribeTopicFromCtx(ctx)
		partition, okP := kafka.MessagePartitionFromCtx(ctx)
		offset, okO := kafka.MessagePartitionOffsetFromCtx(ctx)
		switch {
		case topic == "":
			return nil, fmt.Errorf("%w: message %s: no subscribe topic in its context (not consumed through a Watermill router)", keyfuncs.ErrNoKey, name(msg))
		case !okP || !okO:
			return nil, fmt.Errorf("%w: message %s: no Kafka partition/offset in its context (not consumed with watermill-kafka)", keyfuncs.ErrNoKey, name(msg))
		}
		key := topic + "/" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10)
		return []string{keyfuncs.Bound(key)}, nil
	}
}

// RecordKey keys a message by its Kafka record key, read from the context
// value watermill-kafka's subscriber sets. Use it only when the producer
// keys each record by the event's own identity (an order id with its
// operation, an idempotency key): a key shared by many events, such as a
// customer id chosen to keep a customer's events in one partition, makes
// every event after the first of that key a duplicate. The key's bytes are
// kept as they are (binary keys too), bounded by keyfuncs.Bound.
//
// A record without a key, or with a key of white space only, or a message
// not consumed with watermill-kafka, gives an error wrapping
// keyfuncs.ErrNoKey.
func RecordKey() keyfuncs.KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		key, ok := kafka.MessageKeyFromCtx(msg.Context())
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: message %s: no Kafka record key in its context (not consumed with watermill-kafka)", keyfuncs.ErrNoKey, name(msg))
		case len(key) == 0:
			return nil, fmt.Errorf("%w: message %s: the Kafka record has no key", keyfuncs.ErrNoKey, name(msg))
		case len(bytes.TrimSpace(key)) == 0:
			return nil, fmt.Errorf("%w: message %s: the Kafka record key %q is blank", keyfuncs.ErrNoKey, name(msg), key)
		}
		return []string{keyfuncs.Bound(string(key))}, nil
	}
}

// PublishedAt is a middleware.Config.PublishedAt that reads the Kafka
// record's timestamp (the producer's create time, or the broker's log
// append time, as the topic says), for the ttl-miss check.
func PublishedAt(msg *message.Message) (time.Time, bool) {
	t, ok := kafka.MessageTimestampFromCtx(msg.Context())
	if !ok || t.IsZero() || t.Unix() <= 0 {
		return time.Time{}, false
	}
	return t, true
}

// name is how errors name msg: its UUID, or, for a record another
// producer wrote without one, its coordinates.
func name(msg *message.Message) string {
	if msg.UUID != "" {
		return msg.UUID
	}
	ctx := msg.Context()
	partition, okP := kafka.MessagePartitionFromCtx(ctx)
	offset, okO := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !okP || !okO {
		return keyfuncs.Name(msg)
	}
	return fmt.Sprintf("(no UUID; Kafka record %s/%d/%d)", message.SubscribeTopicFromCtx(ctx), partition, offset)
}
