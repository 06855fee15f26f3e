// Package kafkakeys keys messages consumed with watermill-kafka by their
// Kafka coordinates. It is a separate package so that importing keyfuncs
// does not pull Sarama into every build.
package kafkakeys

import (
	"fmt"
	"strconv"

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
			return nil, fmt.Errorf("%w: message %s: no subscribe topic in its context (not consumed through a Watermill router)", keyfuncs.ErrNoKey, msg.UUID)
		case !okP || !okO:
			return nil, fmt.Errorf("%w: message %s: no Kafka partition/offset in its context (not consumed with watermill-kafka)", keyfuncs.ErrNoKey, msg.UUID)
		}
		key := topic + "/" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10)
		return []string{keyfuncs.Bound(key)}, nil
	}
}
