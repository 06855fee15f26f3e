package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
)

// e2eBroker is a broker the e2e section drives: a publisher, and a way to
// make a fresh subscriber per run (its own consumer group or queue).
type e2eBroker struct {
	name string // in the RESULT names: kfake1, kfake16, rabbitmq1, ...
	desc string

	// inFlight is how many messages the router has at once: the topic's
	// partitions, or the consumers on the queue (each with a prefetch of
	// one). A message occupies one of them for inFlight ÷ rate.
	inFlight int
	// handlers is how many router handlers subscribe to the topic: one
	// for Kafka (the subscriber runs a goroutine per partition), one per
	// consumer for RabbitMQ (each Subscribe opens a channel and a
	// consumer) and watermill-sql.
	handlers int
	// n is how many messages a run consumes.
	n int
	// cases are what the router is measured with, plain first.
	cases []e2eCase

	pub message.Publisher
	// newSub returns a subscriber in consumer group group (Kafka,
	// watermill-sql; RabbitMQ has none: every subscriber consumes the
	// queue).
	newSub func(group string) (message.Subscriber, error)
	// topic returns the topic (or queue) of name, registered for the
	// broker's cleanup.
	topic func(name string) string
	close func()
}

// sequential says whether the broker hands over one message at a time.
func (b *e2eBroker) sequential() bool { return b.inFlight == 1 }

// openKfake starts an in-process Kafka whose topics have partitions
// partitions, consumed by watermill-kafka's consumer-group subscriber (a
// goroutine per partition, each waiting for its message's ack).
func openKfake(partitions, n int) (*e2eBroker, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
	if err != nil {
		return nil, err
	}
	brokers := cluster.ListenAddrs()
	pcfg := kafka.DefaultSaramaSyncPublisherConfig()
	pcfg.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg}, watermill.NopLogger{})
	if err != nil {
		cluster.Close()
		return nil, err
	}
	var subs []message.Subscriber
	cases := sequentialCases
	if partitions > 1 {
		cases = concurrentCases
	}
	return &e2eBroker{
		name:     "kfake" + strconv.Itoa(partitions),
		desc:     fmt.Sprintf("kfake, %d partition(s)", partitions),
		inFlight: partitions,
		handlers: 1,
		n:        n,
		cases:    cases,
		pub:      pub,
		newSub: func(run string) (message.Subscriber, error) {
			scfg := kafka.DefaultSaramaSubscriberConfig()
			scfg.Version = sarama.V2_8_0_0
			scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: "bench-" + run,
				OverwriteSaramaConfig:  scfg,
				InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1},
			}, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string { return "bench-" + run },
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			cluster.Close()
		},
	}, nil
}

// openRabbit returns RabbitMQ with consumers consumers on each run's
// queue: as many router handlers on the topic, each a channel and a
// consumer with watermill-amqp's durable-queue defaults (prefetch 1).
func openRabbit(consumers, n int) (*e2eBroker, error) {
	url := testkit.AMQPURL()
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ is not reachable at %s (set AMQP_URL): %w", redactDSN(url), err)
	}
	var subs []message.Subscriber
	var queues []string
	cases := sequentialCases
	if consumers > 1 {
		cases = concurrentCases
	}
	return &e2eBroker{
		name:     "rabbitmq" + strconv.Itoa(consumers),
		desc:     fmt.Sprintf("RabbitMQ, %d consumer(s), prefetch 1", consumers),
		inFlight: consumers,
		handlers: consumers,
		n:        n,
		cases:    cases,
		pub:      pub,
		newSub: func(string) (message.Subscriber, error) {
			s, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string {
			q := "dedup-bench-" + run
			queues = append(queues, q)
			return q
		},
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			if conn, err := amqp091.Dial(url); err == nil {
				if ch, err := conn.Channel(); err == nil {
					for _, q := range queues {
						_, _ = ch.QueueDelete(q, false, false, false)
					}
					_ = ch.Close()
				}
				_ = conn.Close()
			}
		},
	}, nil
}

// openSQLPubSub returns watermill-sql's PostgreSQL pub/sub: one consumer
// group reading a topic table in order, one message at a time.
func openSQLPubSub(ctx context.Context, n int) (*e2eBroker, error) {
	db, err := anystore.OpenDB(ctx, anystore.StoreParams{Kind: anystore.StorePostgres, PoolSize: 4})
	if err != nil {
		return nil, err
	}
	schema := wsql.DefaultPostgreSQLSchema{}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	var subs []*wsql.Subscriber
	var topics []string
	return &e2eBroker{
		name:     "sqlpg",
		desc:     "watermill-sql on PostgreSQL, one consumer group",
		inFlight: 1,
		handlers: 1,
		n:        n,
		cases:    sqlCases,
		pub:      pub,
		newSub: func(run string) (message.Subscriber, error) {
			s, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
				ConsumerGroup:    "bench_" + run,
				SchemaAdapter:    schema,
				OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
				InitializeSchema: true,
				PollInterval:     10 * time.Millisecond,
			}, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string {
			t := "dedup_bench_" + run
			topics = append(topics, t)
			return t
		},
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			for _, t := range topics {
				dropTable(db, `"watermill_`+t+`"`)
				dropTable(db, `"watermill_offsets_`+t+`"`)
			}
			_ = db.Close()
		},
	}, nil
}

func dropTable(db *sql.DB, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
}
