package kafkakeys_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
)

// TestRecordTimestampAtEpochIsNoTime: a producer that stamps its records
// with 0 (the Unix epoch) gives no publication time; PublishedAt reads
// it as none, and reads a record stamped after the epoch as it is.
func TestRecordTimestampAtEpochIsNoTime(t *testing.T) {
	const topic = "stamped"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(cluster.ListenAddrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	stamps := []time.Time{time.Unix(0, 0), time.Unix(1, 0), time.UnixMilli(1_700_000_000_123)}
	for _, at := range stamps {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x"), Timestamp: at}); err != nil {
			t.Fatal(err)
		}
	}

	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               cluster.ListenAddrs(),
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := range stamps {
		msg := keytest.Await(t, msgs, 1)[0]
		msg.Ack()
		got, ok := kafkakeys.PublishedAt(msg)
		if i == 0 && ok {
			t.Errorf("a record stamped at the epoch: PublishedAt = %v, want no time", got)
		}
		if i > 0 && (!ok || !got.Equal(stamps[i])) {
			t.Errorf("a record stamped %v: PublishedAt = %v, %v", stamps[i], got, ok)
		}
	}
}
