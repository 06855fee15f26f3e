package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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

	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
)

// broker is a publisher and a subscriber on one message broker, and the
// names of what this run uses on it.
type broker struct {
	name        string
	runID       string
	addr        string // where it is, for the summary (no secrets)
	pub         message.Publisher
	sub         message.Subscriber
	topic       string
	poisonTopic string
	group       string   // consumer group, where the broker has them
	db          *sql.DB  // the SQL pub/subs' database
	kafka       []string // Kafka's bootstrap addresses (the in-process cluster's too)

	// producer publishes the events: pub, or the broker's own client
	// under -producer=foreign. pub still publishes to the poison topic.
	producer     producer
	producerText string // for the summary

	// drained, when set, reports whether the broker has durably recorded
	// the ack of every message of the topic. The SQL pub/subs commit an ack
	// after the handler returned, in the subscriber's transaction (together
	// with the inbox record and the ledger, when they join it); closing the
	// router before that commit rolls it back and the message would come
	// again on the next start. The run waits for it before closing.
	drained func(ctx context.Context) (bool, error)

	// brokerDedup, when set, describes what the broker's own dedup
	// caught, for the summary (JetStream's Nats-Msg-Id window).
	brokerDedup func() string
}

// Names of what a run creates. The run id keeps concurrent runs (and
// tests) apart on shared services.
func topicName(brokerName, runID string) string {
	if isSQLBroker(brokerName) {
		// watermill-sql makes table names of topics: no dots on MySQL.
		return "payment_completed_" + runID
	}
	return "payment.completed." + runID
}

func consumerGroup(runID string) string { return "loyalty_" + runID }

// openBroker connects to the configured broker. Closing what it opened is
// added to closers; removing what it created (topics, queues, tables) to
// removers, which run only under -cleanup.
func openBroker(ctx context.Context, cfg Config, runID string, logger watermill.LoggerAdapter, closers, removers *teardown) (*broker, error) {
	b := &broker{
		name:        cfg.Broker,
		runID:       runID,
		topic:       topicName(cfg.Broker, runID),
		poisonTopic: topicName(cfg.Broker, runID) + ".poison",
		group:       consumerGroup(runID),
	}
	if isSQLBroker(cfg.Broker) {
		b.poisonTopic = topicName(cfg.Broker, runID) + "_poison"
	}
	var err error
	switch cfg.Broker {
	case brokerGoChannel:
		err = b.openGoChannel(logger, closers)
	case brokerKafka, brokerKafkaEmbedded:
		err = b.openKafka(ctx, cfg, logger, closers, removers)
	case brokerAMQP:
		err = b.openAMQP(ctx, cfg, logger, closers, removers)
	case brokerPostgres, brokerMySQL:
		err = b.openSQL(ctx, cfg, logger, closers, removers)
	case brokerNATS:
		err = b.openNATS(ctx, cfg, logger, closers, removers)
	case brokerRedisStreams:
		err = b.openRedisStreams(ctx, cfg, logger, closers, removers)
	default:
		err = fmt.Errorf("unknown broker %q (set -broker)", cfg.Broker)
	}
	if err != nil {
		return nil, err
	}
	if b.producer == nil {
		if cfg.Producer == producerForeign {
			return nil, errNoForeignProducer
		}
		b.producer, b.producerText = watermillProducer{b.pub}, watermillProducerText
	}
	// Create the topics (queues, tables) before anything is published:
	// AMQP drops a message sent to a queue that does not exist yet, and
	// the Kafka consumer group needs its topic.
	if init, ok := b.sub.(message.SubscribeInitializer); ok {
		for _, t := range []string{b.topic, b.poisonTopic} {
			if err := awaitErr(ctx, "creating "+b.name+" topic "+t, func() error { return init.SubscribeInitialize(t) }); err != nil {
				return nil, fmt.Errorf("%s: create topic %s: %w", b.name, t, err)
			}
		}
	}
	return b, nil
}

func (b *broker) openGoChannel(logger watermill.LoggerAdapter, closers *teardown) error {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, logger)
	closers.add("close gochannel", func(context.Context) error { return ps.Close() })
	b.addr = "in-process"
	b.pub, b.sub = ps, ps
	return nil
}

// Kafka with the idempotent producer, the first line of
// defence against the producer's own retries (the broker drops a batch it
// already appended from the same producer session). It does not survive a
// producer restart, an application-level republish under a new message id,
// or any consumer-side redelivery: the dedup middleware still has to run.
func kafkaProducerConfig() *sarama.Config {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	// Sarama needs the protocol version set explicitly: idempotence needs
	// 0.11+, and older defaults fail silently against newer brokers.
	c.Version = sarama.V2_8_0_0
	c.ClientID = "router_example"
	c.Producer.Idempotent = true                // enable.idempotence=true
	c.Producer.RequiredAcks = sarama.WaitForAll // acks=all
	c.Net.MaxOpenRequests = 1                   // sarama allows only 1 in flight with idempotence
	c.Producer.Retry.Max = 10                   // retries, bounded: SendMessage must return
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Metadata.Retry.Max = 3
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Net.DialTimeout = dialTimeout // Sarama's default: 30s a connection attempt
	return c
}

// kafkaSetting is what changes the Kafka brokers' addresses.
const kafkaSetting = "-kafka-brokers or KAFKA_BROKERS"

func kafkaConsumerConfig() *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = sarama.V2_8_0_0
	c.ClientID = "router_example"
	// A new consumer group starts at the oldest offset: it must see events
	// published before it joined.
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Metadata.Retry.Max = 3
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Net.DialTimeout = dialTimeout
	return c
}

// kafkaPartitions of the topics the example creates: several, so that
// partitions are consumed concurrently; two a consumer process under
// -processes, so that each has some after a rebalance.
func kafkaPartitions(cfg Config) int32 { return int32(max(4, 2*cfg.Processes)) }

// kafkaSubscriberConfig is kafkaConsumerConfig with -kafka-session-timeout:
// a consumer that dies without leaving the group (SIGKILL) holds its
// partitions until its session times out, and the group rebalances.
func kafkaSubscriberConfig(cfg Config) *sarama.Config {
	c := kafkaConsumerConfig()
	if d := cfg.KafkaSessionTimeout; d > 0 {
		c.Consumer.Group.Session.Timeout = d
		c.Consumer.Group.Heartbeat.Interval = d / 4 // Sarama's ratio is 3s to 10s
	}
	// Sarama waits for a JoinGroup's answer Net.ReadTimeout (30s) only,
	// while the broker may hold it for the rebalance timeout (60s by
	// default) when a member is slow to rejoin: the joiners then fail
	// with an i/o timeout, and join again, round after round. A rebalance
	// that gives up on a member sooner than the read timeout ends.
	c.Consumer.Group.Rebalance.Timeout = min(c.Consumer.Group.Rebalance.Timeout, c.Net.ReadTimeout/2)
	return c
}

// embeddedMinSessionTimeout is the in-process Kafka's
// group.min.session.timeout.ms: lower than a real broker's 6s, so that the
// consumers of -processes can take 2s.
const embeddedMinSessionTimeout = 500 * time.Millisecond

func (b *broker) openKafka(ctx context.Context, cfg Config, logger watermill.LoggerAdapter, closers, removers *teardown) error {
	brokers := cliflag.SplitList(cfg.KafkaBrokers)
	rf := int16(cfg.KafkaRF)
	if cfg.Broker == brokerKafkaEmbedded {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(embeddedMinSessionTimeout))
		if err != nil {
			return fmt.Errorf("start the embedded Kafka (kfake): %w", err)
		}
		closers.add("stop the embedded Kafka", func(context.Context) error { cluster.Close(); return nil })
		brokers, rf = cluster.ListenAddrs(), 1
		b.addr = "in-process kfake at " + strings.Join(brokers, ",")
	} else {
		// Something that accepts connections and never answers would
		// hold Sarama for minutes: it must answer a request first.
		if err := probeAnswer(ctx, "Kafka", brokers[0], kafkaSetting, kafkaHello(), kafkaAnswer); err != nil {
			return err
		}
		b.addr = strings.Join(brokers, ",")
	}

	b.kafka = brokers

	// Messages of one customer go to one partition, in order; a producer
	// retry lands on the partition of its original.
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get(metaCustomerID), nil
	})
	// Sarama takes no context: await ends the wait at a signal, or
	// after stepTimeout.
	pub, err := await(ctx, "connecting the Kafka publisher to "+b.addr, func() (*kafka.Publisher, error) {
		return kafka.NewPublisher(kafka.PublisherConfig{
			Brokers:               brokers,
			Marshaler:             marshaler,
			OverwriteSaramaConfig: kafkaProducerConfig(),
		}, logger)
	}, func(p *kafka.Publisher) { _ = p.Close() })
	if err != nil {
		return unreachable("Kafka", b.addr, kafkaSetting, err)
	}
	closers.add("close the Kafka publisher", func(context.Context) error { return pub.Close() })
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:                brokers,
		Unmarshaler:            marshaler,
		ConsumerGroup:          b.group,
		OverwriteSaramaConfig:  kafkaSubscriberConfig(cfg),
		NackResendSleep:        50 * time.Millisecond,
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: kafkaPartitions(cfg), ReplicationFactor: rf},
	}, logger)
	if err != nil {
		return err
	}
	closers.add("close the Kafka subscriber", func(context.Context) error { return sub.Close() })
	b.pub, b.sub = pub, sub
	if cfg.Producer == producerForeign {
		p, err := await(ctx, "connecting the Sarama producer to "+b.addr, func() (*kafkaForeignProducer, error) {
			return newKafkaForeignProducer(brokers)
		}, func(p *kafkaForeignProducer) { _ = p.Close() })
		if err != nil {
			return unreachable("Kafka", b.addr, kafkaSetting, err)
		}
		closers.add("close the Sarama producer", func(context.Context) error { return p.Close() })
		b.producer, b.producerText = p, kafkaForeignText
	}

	if cfg.Broker == brokerKafkaEmbedded {
		return nil // the in-process cluster goes with its topics
	}
	removers.add("delete Kafka topics "+b.topic+", "+b.poisonTopic+" and group "+b.group, func(context.Context) error {
		admin, err := sarama.NewClusterAdmin(brokers, kafkaConsumerConfig())
		if err != nil {
			return err
		}
		defer admin.Close()
		var errs []error
		for _, t := range []string{b.topic, b.poisonTopic} {
			if err := admin.DeleteTopic(t); err != nil {
				errs = append(errs, fmt.Errorf("delete topic %s: %w", t, err))
			}
		}
		if err := admin.DeleteConsumerGroup(b.group); err != nil {
			errs = append(errs, fmt.Errorf("delete group %s: %w", b.group, err))
		}
		return errors.Join(errs...)
	})
	return nil
}

// amqpSetting is what changes RabbitMQ's URL.
const amqpSetting = "-amqp-url or AMQP_URL"

func (b *broker) openAMQP(ctx context.Context, cfg Config, logger watermill.LoggerAdapter, closers, removers *teardown) error {
	b.addr = redactURL(cfg.AMQPURL)
	tlsURL := strings.HasPrefix(cfg.AMQPURL, "amqps://")
	port := "5672"
	if tlsURL {
		port = "5671"
	}
	hostPort, err := urlHostPort(cfg.AMQPURL, port)
	if err != nil {
		return fmt.Errorf("-amqp-url (or AMQP_URL): %w", err)
	}
	// Something that accepts connections and never answers would hold
	// amqp091 for its 30s handshake: it must answer the protocol header
	// (over TLS, amqp091's bounded TLS handshake is the probe).
	if tlsURL {
		err = storeopen.ProbeTCP(ctx, "RabbitMQ", hostPort, amqpSetting)
	} else {
		err = probeAnswer(ctx, "RabbitMQ", hostPort, amqpSetting, amqpHello, amqpAnswer)
	}
	if err != nil {
		return err
	}
	// One durable queue per topic on the default exchange; a nack
	// requeues the message.
	acfg := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	// The handshake bounded by dialTimeout (amqp091's default: 30s);
	// amqp091 fills in its defaults for the rest.
	acfg.Connection.AmqpConfig = &amqp091.Config{Dial: amqp091.DefaultDial(dialTimeout)}
	acfg.Publish.ConfirmDelivery = true // Publish returns once RabbitMQ has the message
	// amqpkeys.Marshaler unmarshals as watermill-amqp's own does, and also
	// takes the message_id property as the UUID when a message has no
	// Watermill UUID header (a producer that is not Watermill), keeps the
	// AMQP properties as metadata, and turns non-string headers into
	// strings instead of failing the delivery for ever. A Watermill
	// message keeps its UUID, so it is used whoever the producer is.
	acfg.Marshaler = amqpkeys.Marshaler{Inner: acfg.Marshaler}
	// watermill-amqp takes no context: await ends the wait at a signal.
	pub, err := await(ctx, "connecting the RabbitMQ publisher to "+b.addr, func() (*amqp.Publisher, error) {
		return amqp.NewPublisher(acfg, logger)
	}, func(p *amqp.Publisher) { _ = p.Close() })
	if err != nil {
		return unreachable("RabbitMQ", b.addr, amqpSetting, err)
	}
	closers.add("close the RabbitMQ publisher", func(context.Context) error { return pub.Close() })
	sub, err := await(ctx, "connecting the RabbitMQ subscriber to "+b.addr, func() (*amqp.Subscriber, error) {
		return amqp.NewSubscriber(acfg, logger)
	}, func(s *amqp.Subscriber) { _ = s.Close() })
	if err != nil {
		return unreachable("RabbitMQ", b.addr, amqpSetting, err)
	}
	closers.add("close the RabbitMQ subscriber", func(context.Context) error { return sub.Close() })
	b.pub, b.sub = pub, sub
	if cfg.Producer == producerForeign {
		p, err := await(ctx, "connecting the amqp091 producer to "+b.addr, func() (*amqpForeignProducer, error) {
			return newAMQPForeignProducer(cfg.AMQPURL)
		}, func(p *amqpForeignProducer) { _ = p.Close() })
		if err != nil {
			return unreachable("RabbitMQ", b.addr, amqpSetting, err)
		}
		closers.add("close the amqp091 producer connection", func(context.Context) error { return p.Close() })
		b.producer, b.producerText = p, amqpForeignText
	}

	url := cfg.AMQPURL
	removers.add("delete RabbitMQ queues "+b.topic+", "+b.poisonTopic, func(context.Context) error {
		conn, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(dialTimeout)})
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		var errs []error
		for _, q := range []string{b.topic, b.poisonTopic} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
			}
		}
		return errors.Join(errs...)
	})
	return nil
}

func (b *broker) openSQL(ctx context.Context, cfg Config, logger watermill.LoggerAdapter, closers, removers *teardown) error {
	db, addr, err := openDB(ctx, cfg, cfg.Broker)
	if err != nil {
		return err
	}
	closers.add("close the "+cfg.Broker+" pub/sub connection", func(context.Context) error { return db.Close() })
	b.db, b.addr = db, addr

	// The default adapters also name their tables, for the cleanup.
	var (
		schema interface {
			wsql.SchemaAdapter
			MessagesTable(topic string) string
		}
		offsets interface {
			wsql.OffsetsAdapter
			MessagesOffsetsTable(topic string) string
		}
	)
	if cfg.Broker == brokerPostgres {
		schema, offsets = wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
	} else {
		schema, offsets = wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
	}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	closers.add("close the SQL publisher", func(context.Context) error { return pub.Close() })
	// wsql3's subscriber, so that the store can join its transaction: it
	// commits only what the router acked, also when it closes or a
	// handler outlives its AckDeadline.
	sub, err := wsql3.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    b.group,
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     100 * time.Millisecond,
		ResendInterval:   50 * time.Millisecond,
		RetryInterval:    100 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	closers.add("close the SQL subscriber", func(context.Context) error { return sub.Close() })
	b.pub, b.sub = pub, sub
	if cfg.Producer == producerForeign {
		b.producer = newSQLForeignProducer(db, cfg.Broker, schema.MessagesTable(b.topic))
		b.producerText = sqlForeignText
	}

	quote := func(col string) string { return "`" + col + "`" }
	if cfg.Broker == brokerPostgres {
		quote = func(col string) string { return `"` + col + `"` }
	}
	placeholder := "?"
	if cfg.Broker == brokerPostgres {
		placeholder = "$1"
	}
	drainQuery := "SELECT COALESCE((SELECT offset_acked FROM " + offsets.MessagesOffsetsTable(b.topic) +
		" WHERE consumer_group = " + placeholder + "), 0) >= " +
		"(SELECT COALESCE(MAX(" + quote("offset") + "), 0) FROM " + schema.MessagesTable(b.topic) + ")"
	b.drained = func(ctx context.Context) (bool, error) {
		var ok bool
		err := db.QueryRowContext(ctx, drainQuery, b.group).Scan(&ok)
		return ok, err
	}

	var tables []string
	for _, t := range []string{b.topic, b.poisonTopic} {
		tables = append(tables, schema.MessagesTable(t), offsets.MessagesOffsetsTable(t))
	}
	removers.add("drop "+cfg.Broker+" pub/sub tables "+strings.Join(tables, ", "), func(ctx context.Context) error {
		var errs []error
		for _, t := range tables {
			// The names come from watermill-sql's adapters, already quoted.
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				errs = append(errs, fmt.Errorf("drop %s: %w", t, err))
			}
		}
		return errors.Join(errs...)
	})
	return nil
}
