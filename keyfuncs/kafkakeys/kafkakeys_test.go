package kafkakeys_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
)

// lastPartition sends every record to the topic's last partition, so the
// key shows a partition other than 0.
type lastPartition struct{}

func (lastPartition) Partition(_ *sarama.ProducerMessage, n int32) (int32, error) { return n - 1, nil }
func (lastPartition) RequiresConsistency() bool                                   { return true }

type keyed struct {
	uuid string
	keys []string
	err  error
}

// runRouter runs a router whose only handler, subscribed to topic through
// sub, sends what KafkaOffset gives each message to the returned channel.
func runRouter(t *testing.T, topic string, sub message.Subscriber) <-chan keyed {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan keyed, 16)
	key := kafkakeys.KafkaOffset()
	router.AddConsumerHandler("h", topic, sub, func(msg *message.Message) error {
		keys, err := key(msg)
		out <- keyed{msg.UUID, keys, err}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	<-router.Running()
	return out
}

func receive(t *testing.T, ch <-chan keyed) keyed {
	t.Helper()
	select {
	case k := <-ch:
		return k
	case <-time.After(30 * time.Second):
		t.Fatal("no message reached the handler")
		return keyed{}
	}
}

// Records consumed from Kafka through a router are keyed by their topic,
// partition and offset: consecutive records of one partition get
// consecutive offsets.
func TestKafkaOffsetThroughRouter(t *testing.T) {
	const topic = "orders"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	pcfg := kafka.DefaultSaramaSyncPublisherConfig()
	pcfg.Version = sarama.V2_8_0_0
	pcfg.Producer.Partitioner = func(string) sarama.Partitioner { return lastPartition{} }
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: pcfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if err := pub.Publish(topic, message.NewMessage("m0", []byte("a")), message.NewMessage("m1", []byte("b"))); err != nil {
		t.Fatal(err)
	}

	scfg := kafka.DefaultSaramaSubscriberConfig()
	scfg.Version = sarama.V2_8_0_0
	scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	scfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: scfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })

	out := runRouter(t, topic, sub)
	want := map[string]string{"m0": "orders/2/0", "m1": "orders/2/1"}
	for range want {
		k := receive(t, out)
		if k.err != nil {
			t.Fatalf("message %s: %v", k.uuid, k.err)
		}
		if len(k.keys) != 1 || k.keys[0] != want[k.uuid] {
			t.Fatalf("message %s: keys %q, want [%s]", k.uuid, k.keys, want[k.uuid])
		}
	}
}

// A message consumed through a router from another broker has a topic but
// no Kafka coordinates: no key.
func TestKafkaOffsetNotFromKafka(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	out := runRouter(t, "events", ps)
	if err := ps.Publish("events", message.NewMessage("g1", nil)); err != nil {
		t.Fatal(err)
	}
	k := receive(t, out)
	if !errors.Is(k.err, keyfuncs.ErrNoKey) || !strings.Contains(k.err.Error(), "no Kafka partition/offset") || !strings.Contains(k.err.Error(), "g1") {
		t.Fatalf("keys %q, error %v: want ErrNoKey naming g1 and the missing Kafka coordinates", k.keys, k.err)
	}
}

// A message outside any router has no subscribe topic: no key.
func TestKafkaOffsetOutsideRouter(t *testing.T) {
	keys, err := kafkakeys.KafkaOffset()(message.NewMessage("bare", nil))
	if !errors.Is(err, keyfuncs.ErrNoKey) || !strings.Contains(err.Error(), "no subscribe topic") || !strings.Contains(err.Error(), "bare") {
		t.Fatalf("keys %q, error %v: want ErrNoKey naming the message and the missing topic", keys, err)
	}
}
