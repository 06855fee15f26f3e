package kafkakeys_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/twmb/franz-go/pkg/kfake"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// lastPartition sends every record to the topic's last partition, so the
// key shows a partition other than 0.
type lastPartition struct{}

func (lastPartition) Partition(_ *sarama.ProducerMessage, n int32) (int32, error) { return n - 1, nil }
func (lastPartition) RequiresConsistency() bool                                   { return true }

// kafkaCluster starts a fake Kafka cluster of one broker with topic
// seeded in partitions partitions, and returns its addresses.
func kafkaCluster(t *testing.T, topic string, partitions int32) []string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster.ListenAddrs()
}

// saramaProducer is a producer that is not Watermill: Sarama's own
// SyncProducer, configured by cfg (its version and its successes
// returned set here).
func saramaProducer(t *testing.T, brokers []string, cfg *sarama.Config) sarama.SyncProducer {
	t.Helper()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	return prod
}

// oldestSubscriber is a watermill-kafka subscriber on Sarama's cfg (nil:
// watermill-kafka's default, at Sarama's version 2.8), set here to read
// from the oldest offset without waiting long for a fetch. A producer's
// cfg keeps its version: the producer reads it as it runs.
func oldestSubscriber(t *testing.T, brokers []string, cfg *sarama.Config) *kafka.Subscriber {
	t.Helper()
	if cfg == nil {
		cfg = kafka.DefaultSaramaSubscriberConfig()
		cfg.Version = sarama.V2_8_0_0
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

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
	brokers := kafkaCluster(t, topic, 3)

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

	sub := oldestSubscriber(t, brokers, nil)

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

// TestForeignProducerRecords: a producer that is not Watermill (Sarama's
// own SyncProducer) writes the same event twice under one record key,
// plus a keyless record and one whose key is blank. Consumed with watermill-kafka, the records have no
// UUID, so keyfuncs.MessageID() cannot key them; RecordKey does, the
// middleware runs the handler once for the two copies, PublishedAt reads
// the record timestamp, and the keyless record is refused as bad input.
func TestForeignProducerRecords(t *testing.T) {
	const topic = "payments"
	brokers := kafkaCluster(t, topic, 1)

	prod := saramaProducer(t, brokers, sarama.NewConfig())
	published := time.Now().Truncate(time.Millisecond)
	for _, key := range []sarama.Encoder{sarama.StringEncoder("pay-42:capture"), sarama.StringEncoder("pay-42:capture"), nil, sarama.StringEncoder(" ")} {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: key, Value: sarama.StringEncoder(`{"amount":5}`), Timestamp: published}); err != nil {
			t.Fatal(err)
		}
	}

	sub := oldestSubscriber(t, brokers, nil)
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	mw, err := middleware.New(middleware.Config{Store: store, Key: kafkakeys.RecordKey(), PublishedAt: kafkakeys.PublishedAt})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		uuid string
		err  error
		at   time.Time
	}
	var (
		mu   sync.Mutex
		runs int
		seen = make(chan outcome, 8)
	)
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			at, _ := kafkakeys.PublishedAt(msg)
			out, err := h(msg)
			seen <- outcome{msg.UUID, err, at}
			return out, nil // ack even the refused one: the test reads what happened
		}
	}, mw.Middleware)
	router.AddConsumerHandler("payments", topic, sub, func(*message.Message) error {
		mu.Lock()
		runs++
		mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()

	var refused int
	for range 4 {
		select {
		case o := <-seen:
			if o.uuid != "" {
				t.Errorf("a record from a foreign producer has UUID %q", o.uuid)
			}
			if !o.at.Equal(published) {
				t.Errorf("PublishedAt = %v, want the record timestamp %v", o.at, published)
			}
			if o.err != nil {
				if !errors.Is(o.err, keyfuncs.ErrNoKey) || !dedup.IsPermanent(o.err) {
					t.Errorf("the keyless record: %v, want a permanent ErrNoKey", o.err)
				}
				if !strings.Contains(o.err.Error(), "Kafka record payments/0/") {
					t.Errorf("the keyless record's error %q does not name it by its coordinates", o.err)
				}
				refused++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("timed out waiting for the four records")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || refused != 2 {
		t.Fatalf("handler runs = %d, refused = %d; want the keyed event once, and the keyless record and the one keyed by a blank refused", runs, refused)
	}
}

// TestRecordTimestampAtEpochIsNoTime: a producer that stamps its records
// with 0 (the Unix epoch) gives no publication time; PublishedAt reads
// it as none, and reads a record stamped after the epoch as it is.
func TestRecordTimestampAtEpochIsNoTime(t *testing.T) {
	const topic = "stamped"
	brokers := kafkaCluster(t, topic, 1)
	cfg := sarama.NewConfig()
	prod := saramaProducer(t, brokers, cfg)
	stamps := []time.Time{time.Unix(0, 0), time.Unix(1, 0), time.UnixMilli(1_700_000_000_123)}
	for _, at := range stamps {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x"), Timestamp: at}); err != nil {
			t.Fatal(err)
		}
	}

	sub := oldestSubscriber(t, brokers, cfg)
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
