package acceptance_test

import (
	"os"
	"testing"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// stores returns every store in every mode.
func stores() []acceptance.Store {
	return []acceptance.Store{
		memStore(),
		redisStore(),
		redisAsyncStore(),
		natsStore(),
		sqlStore(sqlstore.SQLite, false),
		sqlStore(sqlstore.SQLite, true),
		sqlStore(sqlstore.Postgres, false),
		sqlStore(sqlstore.Postgres, true),
		sqlStore(sqlstore.MySQL, false),
		sqlStore(sqlstore.MySQL, true),
	}
}

// storeScenarios are the scenarios every store runs on gochannel and on
// Kafka.
var storeScenarios = []acceptance.Scenario{
	acceptance.NackRedelivery,
	acceptance.ConsumerCrash,
	acceptance.ConcurrentDuplicates,
	acceptance.ProducerRepublish,
	acceptance.StoreOutage,
	acceptance.GracefulShutdown,
	acceptance.SubscriberDeadline,
	acceptance.ConsumerRebalance,
	acceptance.SlowStore,
}

// lifecycleScenarios run on every row of the matrix, the lean ones too.
var lifecycleScenarios = []acceptance.Scenario{
	acceptance.GracefulShutdown,
	acceptance.SubscriberDeadline,
	acceptance.ConsumerRebalance,
	acceptance.SlowStore,
}

// TestAcceptance runs the matrix:
//
//   - every scenario on every broker (the foreign producer is n/a on
//     gochannel, which has no client but Watermill's): gochannel with
//     memstore (and with Redis for the outage, which memstore cannot
//     have) and with natsstore, on the shared NATS server and on one of
//     the current release (nats-current); Kafka, RabbitMQ, NATS JetStream and
//     Redis Streams with Redis in lease mode and with Redis in lease mode
//     with AsyncComplete (redis-async: ack first, Complete in the
//     background); NATS JetStream and Redis Streams also with sqlstore on
//     PostgreSQL in lease mode; NATS JetStream on a server of the current
//     release with nats-current; each watermill-sql pub/sub with sqlstore
//     in transactional mode on the same database (joining the
//     subscriber's transaction, the default; and in its own transaction
//     for the crash and lease expiry scenarios); the same on the new
//     majors, lean: watermill-sql v4 (sql-v4-*) joined through every
//     scenario, in the store's own transaction through the crash, lease
//     expiry and lifecycle scenarios, and watermill-amqp
//     v3 (rabbitmq-v3) with Redis in lease mode through every scenario;
//   - every store, in every mode, through scenarios 1-4, 6 and 11-14 on
//     gochannel and on Kafka;
//   - every row above through the lifecycle scenarios 11-14 (graceful
//     shutdown, subscriber deadline, consumer rebalance, slow store),
//     recorded as n/a with the reason where one cannot apply.
//
// Kafka is kfake in the test process, and also the cluster in
// KAFKA_BROKERS when that is set.
func TestAcceptance(t *testing.T) {
	kafkas := []acceptance.Backend{kafkaFake()}
	if brokers := os.Getenv("KAFKA_BROKERS"); brokers != "" {
		kafkas = append(kafkas, kafkaReal(brokers))
	}

	acceptance.Run(t, goChannel(), memStore())
	acceptance.Run(t, goChannel(), natsStore())
	// The current nats-server (per-key TTLs), each scenario on servers
	// of its own: the store through every scenario, and the broker with
	// it. The shared server (2.9.10) runs the other NATS rows.
	acceptance.Run(t, goChannel(), natsCurrentStore())
	acceptance.Run(t, natsJetStreamCurrent(), natsCurrentStore())
	for _, k := range kafkas {
		acceptance.Run(t, k, redisStore())
		acceptance.Run(t, k, redisAsyncStore())
	}
	acceptance.Run(t, rabbitMQ(), redisStore())
	acceptance.Run(t, rabbitMQ(), redisAsyncStore())
	for _, b := range []acceptance.Backend{natsJetStream(), redisStreams()} {
		acceptance.Run(t, b, redisStore())
		acceptance.Run(t, b, redisAsyncStore())
		acceptance.Run(t, b, sqlStore(sqlstore.Postgres, false))
	}
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		acceptance.Run(t, sqlPubSub(d), sqlStore(d, true))
		// The inbox joining the subscriber's transaction (JoinTx),
		// through every scenario: the stalled handler outlives the
		// subscriber's AckDeadline, whose guard then rolls the
		// transaction back rather than let watermill-sql commit it
		// under the running handler.
		acceptance.Run(t, sqlPubSub(d), sqlStoreJoinedTx(d))
		// watermill-sql v4: the joined store (wsql4.SubscriberTx)
		// through every scenario, and the store's own transaction
		// through those that kill its consumers or stall them.
		acceptance.Run(t, sqlPubSub4(d), sqlStoreJoinedTx4(d))
		acceptance.Run(t, sqlPubSub4(d), sqlStore(d, true), append([]acceptance.Scenario{acceptance.ConsumerCrash, acceptance.LeaseExpiry}, lifecycleScenarios...)...)
	}
	// watermill-amqp v3, lean: Redis in lease mode (AsyncComplete is the
	// middleware's, the same on either major).
	acceptance.Run(t, rabbitMQ3(), redisStore())

	for _, s := range stores() {
		if s.Name != "memstore" && s.Name != "nats" { // they ran every scenario above
			acceptance.Run(t, goChannel(), s, storeScenarios...)
		}
		if s.Name != "redis" && s.Name != "redis-async" { // they ran every scenario above
			for _, k := range kafkas {
				acceptance.Run(t, k, s, storeScenarios...)
			}
		}
	}
}
