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
	"github.com/twmb/franz-go/pkg/kfake"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// TestForeignProducerRecords: a producer that is not Watermill (Sarama's
// own SyncProducer) writes the same event twice under one record key,
// plus a keyless record and one whose key is blank. Consumed with watermill-kafka, the records have no
// UUID, so keyfuncs.MessageID() cannot key them; RecordKey does, the
// middleware runs the handler once for the two copies, PublishedAt reads
// the record timestamp, and the keyless record is refused as bad input.
func TestForeignProducerRecords(t *testing.T) {
	const topic = "payments"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	pcfg := sarama.NewConfig()
	pcfg.Version = sarama.V2_8_0_0
	pcfg.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	published := time.Now().Truncate(time.Millisecond)
	for _, key := range []sarama.Encoder{sarama.StringEncoder("pay-42:capture"), sarama.StringEncoder("pay-42:capture"), nil, sarama.StringEncoder(" ")} {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: key, Value: sarama.StringEncoder(`{"amount":5}`), Timestamp: published}); err != nil {
			t.Fatal(err)
		}
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
