package acceptance_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/kafkakeys"
)

// kafkaPartitions is the number of partitions of every topic.
const kafkaPartitions = 4

// kafkaVersion is the protocol version Sarama speaks, what kfake needs
// for consumer groups. It is Sarama's default since watermill-kafka
// v3.1.0 stopped pinning 1.0.0; set here so a new default cannot move it.
var kafkaVersion = sarama.V2_8_0_0

// kafkaFeatures: partitions are shards, delivered in order; a killed
// member's partitions move to the rest of its group.
var kafkaFeatures = acceptance.Features{
	ConsumerGroups: true,
	Persistent:     true,
	Ordered:        true,
	Restartable:    true,
	Shards:         kafkaPartitions,
}

// kafkaFake is Kafka through watermill-kafka (Sarama) against kfake, an
// in-process Kafka-protocol broker, one cluster per scenario. It runs in
// the test process, so it survives the SIGKILL of a child consumer.
func kafkaFake() acceptance.Backend {
	b := kafkaBackend("kafka-kfake")
	b.Setup = func(t *testing.T) (acceptance.Env, error) {
		c, err := kfake.NewCluster(
			kfake.NumBrokers(1),
			kfake.DefaultNumPartitions(kafkaPartitions),
			// Sarama's session timeout below is shorter than a real
			// broker's default minimum.
			kfake.GroupMinSessionTimeout(100*time.Millisecond),
		)
		if err != nil {
			return nil, err
		}
		t.Cleanup(c.Close)
		return acceptance.Env{"brokers": strings.Join(c.ListenAddrs(), ",")}, nil
	}
	return b
}

// kafkaReal is the same against the cluster in KAFKA_BROKERS; it deletes
// the topics and consumer groups each scenario created.
func kafkaReal(brokers string) acceptance.Backend {
	b := kafkaBackend("kafka")
	b.Setup = func(*testing.T) (acceptance.Env, error) {
		return acceptance.Env{"brokers": brokers, "cleanup": "1"}, nil
	}
	return b
}

func kafkaBackend(name string) acceptance.Backend {
	return acceptance.Backend{
		Name:     name,
		Features: kafkaFeatures,
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			admin, err := sarama.NewClusterAdmin(brokersOf(env), saramaConfig())
			if err != nil {
				return err
			}
			defer admin.Close()
			// CreateTime: a record's timestamp is the producer's, which
			// the foreign-producer scenario checks kafkakeys.PublishedAt
			// against (a cluster may default to LogAppendTime).
			createTime := "CreateTime"
			err = admin.CreateTopic(topic, &sarama.TopicDetail{
				NumPartitions:     kafkaPartitions,
				ReplicationFactor: replicationFactor(),
				ConfigEntries:     map[string]*string{"message.timestamp.type": &createTime},
			}, false)
			if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				return err
			}
			if env["cleanup"] != "" {
				t.Cleanup(func() { deleteKafkaTopic(t, env, topic) })
			}
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			cfg := kafka.DefaultSaramaSyncPublisherConfig()
			cfg.Version = kafkaVersion
			cfg.Producer.Partitioner = func(string) sarama.Partitioner { return shardPartitioner{} }
			return kafka.NewPublisher(kafka.PublisherConfig{
				Brokers:               brokersOf(env),
				Marshaler:             kafkaMarshaler,
				OverwriteSaramaConfig: cfg,
			}, nil)
		},
		RemoveGroup: func(t testing.TB, env acceptance.Env, _, group string) error {
			if env["cleanup"] == "" {
				return nil // kfake: the cluster goes with the scenario
			}
			return deleteKafkaGroup(env, group)
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			cfg := kafka.DefaultSaramaSubscriberConfig()
			cfg.Version = kafkaVersion
			cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
			// A SIGKILLed member's partitions move after the session
			// timeout: keep it short (kfake allows it, see above).
			cfg.Consumer.Group.Session.Timeout = 2 * time.Second
			cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
			return kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers:               brokersOf(env),
				Unmarshaler:           kafkaMarshaler,
				ConsumerGroup:         group,
				NackResendSleep:       20 * time.Millisecond,
				ReconnectRetrySleep:   100 * time.Millisecond,
				OverwriteSaramaConfig: cfg,
			}, testLogger())
		},
		// A member heartbeats whatever its handlers do: no delivery
		// deadline; what moves a message under a running handler is a
		// rebalance.
		Deadline:   &acceptance.Deadline{None: "Kafka has no deadline for a delivery: a member keeps its partitions while it heartbeats, however long a handler runs; a message moves under a running handler when the group rebalances (13_consumer_rebalance)"},
		GroupState: kafkaGroupState,
		Native: &acceptance.Native{
			Client:       "sarama SyncProducer",
			NewPublisher: newSaramaProducer,
			// The subscriber is the usual one: watermill-kafka's
			// unmarshaler turns record headers into metadata and puts
			// the record's key, partition, offset and timestamp in the
			// message's context.
			Key:         kafkakeys.RecordKey(),
			KeyName:     "kafkakeys.RecordKey()",
			OtherKeys:   map[string]keyfuncs.KeyFunc{`keyfuncs.Metadata("` + kafkaIDHeader + `")`: keyfuncs.Metadata(kafkaIDHeader)},
			CopyKey:     kafkakeys.KafkaOffset(),
			CopyKeyName: "kafkakeys.KafkaOffset()",
			PublishedAt: kafkakeys.PublishedAt,
		},
	}
}

// kafkaIDHeader is the record header in which the native producer sends
// its id (also the record key).
const kafkaIDHeader = "event-id"

// saramaProducer is a producer that is not Watermill: Sarama's own
// SyncProducer with its default (hash) partitioner, records keyed by the
// producer's id, with the id and a content type in headers, and no
// Watermill UUID header.
type saramaProducer struct{ sarama.SyncProducer }

func newSaramaProducer(_ testing.TB, env acceptance.Env) (acceptance.NativePublisher, error) {
	cfg := saramaConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokersOf(env), cfg)
	if err != nil {
		return nil, err
	}
	return saramaProducer{p}, nil
}

func (p saramaProducer) Publish(topic string, m acceptance.NativeMessage) error {
	_, _, err := p.SendMessage(&sarama.ProducerMessage{
		Topic: topic,
		Key:   sarama.StringEncoder(m.ID),
		Value: sarama.ByteEncoder(m.Payload),
		Headers: []sarama.RecordHeader{
			{Key: []byte(kafkaIDHeader), Value: []byte(m.ID)},
			{Key: []byte("content-type"), Value: []byte("application/json")},
		},
		Timestamp: m.At,
	})
	return err
}

// kafkaMarshaler keys Kafka records by the suite's shard.
var kafkaMarshaler = kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
	return msg.Metadata.Get(acceptance.MetadataShard), nil
})

// shardPartitioner sends a record keyed by a shard number to partition
// shard mod partitions, so consecutive shards are different partitions.
type shardPartitioner struct{}

func (shardPartitioner) Partition(m *sarama.ProducerMessage, partitions int32) (int32, error) {
	if m.Key == nil {
		return 0, nil
	}
	k, err := m.Key.Encode()
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(k))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("record key %q is not a shard number", k)
	}
	return int32(n) % partitions, nil
}

func (shardPartitioner) RequiresConsistency() bool { return true }

func brokersOf(env acceptance.Env) []string { return strings.Split(env["brokers"], ",") }

func saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	return cfg
}

// replicationFactor is KAFKA_REPLICATION_FACTOR, or 1.
func replicationFactor() int16 {
	if n, err := strconv.Atoi(os.Getenv("KAFKA_REPLICATION_FACTOR")); err == nil && n > 0 {
		return int16(n)
	}
	return 1
}

func deleteKafkaTopic(t testing.TB, env acceptance.Env, topic string) {
	admin, err := sarama.NewClusterAdmin(brokersOf(env), saramaConfig())
	if err != nil {
		t.Logf("kafka cleanup: %v", err)
		return
	}
	defer admin.Close()
	if err := admin.DeleteTopic(topic); err != nil {
		t.Logf("kafka cleanup: delete topic %s: %v", topic, err)
	}
}

func deleteKafkaGroup(env acceptance.Env, group string) error {
	admin, err := sarama.NewClusterAdmin(brokersOf(env), saramaConfig())
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := admin.DeleteConsumerGroup(group); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
		return err
	}
	return nil
}

// kafkaGroupState describes the consumer group: its members, and whether
// it is rebalancing (PreparingRebalance: waiting for every member to
// rejoin; CompletingRebalance, AwaitingSync before Kafka 2.4: waiting for
// the leader's assignment).
func kafkaGroupState(_ testing.TB, env acceptance.Env, group string) (acceptance.GroupState, error) {
	admin, err := sarama.NewClusterAdmin(brokersOf(env), saramaConfig())
	if err != nil {
		return acceptance.GroupState{}, err
	}
	defer admin.Close()
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return acceptance.GroupState{}, err
	}
	if len(ds) != 1 {
		return acceptance.GroupState{}, fmt.Errorf("describe group %s: %d groups described", group, len(ds))
	}
	if !errors.Is(ds[0].Err, sarama.ErrNoError) {
		return acceptance.GroupState{}, fmt.Errorf("describe group %s: %w", group, ds[0].Err)
	}
	return acceptance.GroupState{
		Members:     len(ds[0].Members),
		Rebalancing: ds[0].State == "PreparingRebalance" || ds[0].State == "CompletingRebalance" || ds[0].State == "AwaitingSync",
	}, nil
}
