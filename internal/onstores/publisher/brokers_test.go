package publisher_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
)

// pubsub is a broker's publisher and subscriber for one topic.
type pubsub struct {
	pub   message.Publisher
	sub   message.Subscriber
	topic string
}

type brokerCase struct {
	name string
	open func(t *testing.T) pubsub
}

var brokers = []brokerCase{
	{"gochannel", openGoChannel},
	{"kafka", openKafka},
	{"rabbitmq", openAMQP},
	{"sql-postgres", func(t *testing.T) pubsub { return openSQLBroker(t, anystore.StorePostgres) }},
	{"sql-mysql", func(t *testing.T) pubsub { return openSQLBroker(t, anystore.StoreMySQL) }},
}

func openGoChannel(t *testing.T) pubsub {
	// A publish returns once the subscriber acked: the end marker is then
	// the last message the test reads (gochannel delivers a call's
	// messages concurrently otherwise).
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	return pubsub{ps, ps, "events"}
}

func openKafka(t *testing.T) pubsub {
	const topic = "events"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	pcfg := kafka.DefaultSaramaSyncPublisherConfig()
	pcfg.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: cluster.ListenAddrs(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	scfg := kafka.DefaultSaramaSubscriberConfig()
	scfg.Version = sarama.V2_8_0_0
	scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: "readers", OverwriteSaramaConfig: scfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return pubsub{pub, sub, topic}
}

func openAMQP(t *testing.T) pubsub {
	url := testkit.RequireAMQP(t)
	topic := testkit.UniqueName("publisher_test_")
	cfg := amqp.NewDurableQueueConfig(url)
	cfg.Publish.ConfirmDelivery = true
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Close()
		if conn, err := amqp091.Dial(url); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(topic, false, false, false)
			}
			_ = conn.Close()
		}
	})
	return pubsub{pub, sub, topic}
}

// topicTables are the tables of topic, quoted, that the default schema
// and offsets adapters of any watermill-sql major name: the messages
// table first.
func topicTables(schema, offsets any, topic string) []string {
	return []string{
		schema.(interface{ MessagesTable(topic string) string }).MessagesTable(topic),
		offsets.(interface{ MessagesOffsetsTable(topic string) string }).MessagesOffsetsTable(topic),
	}
}

func sqlAdapters(kind anystore.StoreKind) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if kind == anystore.StorePostgres {
		return wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	return wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
}

// openDB opens the database of a SQL kind for a test.
func openDB(t *testing.T, kind anystore.StoreKind) *sql.DB {
	t.Helper()
	anystore.RequireStore(t, kind)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := anystore.OpenDB(ctx, anystore.StoreParams{Kind: kind})
	if err != nil {
		t.Fatalf("open %s: %v", kind, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openSQLBroker(t *testing.T, kind anystore.StoreKind) pubsub {
	db := openDB(t, kind)
	topic := testkit.UniqueName("publisher_test_")
	schema, offsets := sqlAdapters(kind)
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup: "readers", SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true,
		PollInterval: 20 * time.Millisecond, ResendInterval: 20 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := kind.SQLDialect()
	t.Cleanup(func() {
		_ = sub.Close()
		_ = pub.Close()
		if err := sqltest.DropTables(context.Background(), db, d, topicTables(schema, offsets, topic)...); err != nil {
			t.Error(err)
		}
	})
	return pubsub{pub, sub, topic}
}

var errBroker = errors.New("broker said no")

// flaky is a publisher whose first call fails.
type flaky struct {
	message.Publisher
	mu     sync.Mutex
	failed bool
}

func (f *flaky) Publish(topic string, msgs ...*message.Message) error {
	f.mu.Lock()
	first := !f.failed
	f.failed = true
	f.mu.Unlock()
	if first {
		return errBroker
	}
	return f.Publisher.Publish(topic, msgs...)
}

// TestBrokersAndStores publishes through two decorated publishers sharing
// a store, on every broker and every kind of store: each producer
// publishes every event twice, each time as a new message (a new UUID,
// the event id in a header), in batches; one producer's first publish
// fails and is retried. Every event must reach the topic once.
func TestBrokersAndStores(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			for _, kind := range []anystore.StoreKind{anystore.StoreMemory, anystore.StoreRedis, anystore.StorePostgres, anystore.StoreMySQL} {
				t.Run(string(kind), func(t *testing.T) {
					ps := b.open(t)
					testProducersShareStore(t, ps, kind)
				})
			}
		})
	}
}

func testProducersShareStore(t *testing.T, ps pubsub, kind anystore.StoreKind) {
	anystore.RequireStore(t, kind)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opened, closeStore, err := anystore.OpenStore(ctx, anystore.StoreParams{Kind: kind, CreateSchema: true, Teardown: true})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = closeStore(context.Background()) })

	received, err := ps.sub.Subscribe(ctx, ps.topic)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	cfg := publisher.Config{
		Store:  opened.Store,
		Key:    keyfuncs.Metadata("event_id"),
		Policy: dedup.Policy{InProgressWait: 10 * time.Second, Logger: watermill.NopLogger{}},
	}
	producer := func(inner message.Publisher) message.Publisher {
		d, err := publisher.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p, err := d.Decorate(inner)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	producers := []message.Publisher{producer(&flaky{Publisher: ps.pub}), producer(ps.pub)}

	const events, batch = 24, 3
	// The reader counts the events until the end marker, which goes
	// around the decorator after every producer is done; on these
	// brokers (one partition, one queue, one table, a blocking gochannel)
	// it arrives after every event.
	seen := map[string]int{}
	readDone := make(chan error, 1)
	go func() {
		for {
			select {
			case m, ok := <-received:
				if !ok {
					readDone <- errors.New("the subscription closed before the end marker")
					return
				}
				m.Ack()
				if m.Metadata.Get("end") != "" {
					readDone <- nil
					return
				}
				seen[m.Metadata.Get("event_id")]++
			case <-ctx.Done():
				readDone <- fmt.Errorf("the end marker did not arrive: %w", ctx.Err())
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for _, p := range producers {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for first := 0; first < events; first += batch {
					var msgs []*message.Message
					for e := first; e < first+batch; e++ {
						m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"event":%d}`, e)))
						m.Metadata.Set("event_id", fmt.Sprint(e))
						msgs = append(msgs, m)
					}
					if err := publishRetrying(ctx, p, ps.topic, msgs); err != nil {
						t.Errorf("publish events %d-%d: %v", first, first+batch-1, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	end := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	end.Metadata.Set("end", "1")
	if err := ps.pub.Publish(ps.topic, end); err != nil {
		t.Fatalf("publish the end marker: %v", err)
	}
	if err := <-readDone; err != nil {
		t.Fatalf("%v (seen %v)", err, seen)
	}
	for e := range events {
		if n := seen[fmt.Sprint(e)]; n != 1 {
			t.Errorf("event %d reached the topic %d times, want 1", e, n)
		}
	}
	if len(seen) != events {
		t.Errorf("%d distinct events on the topic, want %d", len(seen), events)
	}
}

// publishRetrying is a producer's retry loop: it publishes until the
// call succeeds.
func publishRetrying(ctx context.Context, p message.Publisher, topic string, msgs []*message.Message) error {
	for {
		err := p.Publish(topic, msgs...)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errBroker) && !errors.Is(err, dedup.ErrInProgress) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
