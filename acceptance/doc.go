// Package acceptance is the acceptance suite of the dedup middleware: one
// set of scenarios, run against every Watermill pub/sub and every dedup
// store, proving the project's central promise — one router, any broker,
// the same exactly-once effects — under nacks, crashes, duplicates,
// outages and bad input.
//
// It is modelled on Watermill's pubsub/tests.TestPubSub: a reusable suite
// in normal (non-_test) files that any module can import, a Features
// struct that says what a backend can do, a unique id per scenario for
// its topics, groups, tables and key prefixes, and exported Assert
// helpers. This module runs it from acceptance/*_test.go over the matrix
// described in TestAcceptance (matrix_test.go): every scenario on
// gochannel with memstore and with natsstore (on the shared NATS server
// and, as nats-current, on one of the current release, with per-key
// TTLs, which also runs under NATS JetStream of that release); on Kafka, RabbitMQ, NATS
// JetStream and Redis Streams with redisstore in lease mode, with and
// without AsyncComplete; on NATS JetStream and Redis Streams also with
// sqlstore on PostgreSQL in lease mode; on each watermill-sql pub/sub with
// sqlstore in transactional mode on the same database; the same, leaner,
// on the new majors of the clients (watermill-sql v4, joined and in the
// store's own transaction, and watermill-amqp v3 with Redis); every
// store, in every mode, through scenarios 1-4 and 6 on gochannel and on
// Kafka; and every one of those rows through the lifecycle scenarios
// 11-14 (see below), recorded as n/a, with the reason, where one cannot
// apply.
//
// # Running it
//
//	go test -race -count=1 -v -timeout 20m -run TestAcceptance ./acceptance/
//
// The services come from testkit (PostgreSQL, MariaDB/MySQL,
// Redis, RabbitMQ and NATS with JetStream on their loopback ports, or
// POSTGRES_DSN, MYSQL_DSN, REDIS_ADDR, AMQP_URL, NATS_URL). A missing service fails its scenarios, naming it
// (DEDUP_SKIP_MISSING=1 skips them instead, except under CI). Kafka is kfake, an in-process Kafka-protocol
// broker, plus the cluster in KAFKA_BROKERS when set
// (KAFKA_REPLICATION_FACTOR for its topics, default 1). The nats-current
// rows start nats-server servers of the current release per scenario
// (natstest.CurrentNATS: built once per machine through the Go module
// proxy, or NATS_SERVER_CURRENT).
//
// The run ends with one summary table, broker x store x scenario ->
// events, deliveries, duplicates dropped, effects, result and notes
// (crashes, takeovers, bypasses, ttl misses...). go test prints a passing
// package's output only with -v; ACCEPTANCE_SUMMARY=path also writes the
// table to a file. Other knobs:
//
//   - ACCEPTANCE_EVENTS: base number of events per scenario, any positive
//     integer (default 200; slow scenarios use a fraction of it, and every
//     scenario a minimum of its own, so small values all run the minimal
//     scenarios). ACCEPTANCE_EVENTS=100000 makes a soak run; the waits
//     scale with it. Any other value fails the suite.
//   - ACCEPTANCE_PARALLEL: scenarios run at once (default 8, or
//     -test.parallel). They mostly wait on brokers and leases, so this
//     keeps the whole matrix at about five minutes on two cores.
//   - ACCEPTANCE_LOG=info|debug|trace: log the routers, the middleware and
//     the broker clients to stderr.
//
// # The invariant and the scenarios
//
// Every handler under test records one effect per logical event in a
// Ledger: a table written in the inbox transaction for a transactional
// store, a concurrency-safe list otherwise. Every scenario checks that each
// event has exactly one effect: none lost, none doubled. The documented
// exceptions are counted, never assumed: in lease mode a consumer that
// dies between its effect and Complete may run the effect again (the
// crash scenario asserts the duplicates are at least the planned crashes
// and at most the deliveries any crash caught in that window; with
// Store.AsyncComplete the window lasts after the ack, until the Complete
// lands in the background); in the outage scenario a message whose store
// calls failed may run once more per failed call — a Complete or Extend
// that failed through the outage leaves the record processing for another
// delivery to take over after the lease, and under fail-open a bypassed
// run leaves no record (the scenario checks every doubled event against
// the calls the probe saw fail, and that an event none of whose calls
// failed ran exactly once); and a
// redelivery after the retention window runs again (the retention
// scenario asserts it happens exactly for the late redeliveries, counted
// as ttl misses). See Scenario for the fourteen scenarios: nack
// redelivery, consumer crash, concurrent duplicates, producer republish,
// lease expiry, store outage, bad input, outputs, retention, a foreign
// producer (the broker's native client instead of Watermill's publisher:
// messages without a Watermill UUID, keyed by the broker's documented key
// and a business key, redelivered and republished), and the four
// lifecycle scenarios below.
//
// # The lifecycle scenarios
//
// They hold handlers mid-effect (before or after writing it) and let them
// go on when what they wait for has happened, as the broker or the probe
// reports it, never after a fixed time:
//
//   - 11 graceful shutdown: router.Close while handlers are held; once the
//     router began closing, the ones that finish their effect are
//     released and the ones watching their context return ctx.Err() when
//     it ends; a new consumer of the group resumes. Exactly one effect per
//     event, and every run that finished recorded its event done (lease
//     mode: the Complete runs detached from the message's context;
//     AsyncComplete: the middleware's Close flushes it). A claim the
//     closing router cut in flight is given back as soon as the store
//     answers it: no key waits for its lease, and no takeover happens.
//   - 12 subscriber deadline: a handler outlives the subscriber's own
//     deadline (Backend.Deadline: watermill-sql's AckDeadline, JetStream's
//     AckWait, the Redis Streams claim idle time, RabbitMQ's consumer
//     timeout) while its heartbeat keeps its lease; the message is
//     delivered again under it. Lease mode: the second delivery finds it
//     in progress and ends as a duplicate (a takeover only where the probe
//     saw the lease run out, at most one more effect). Transactional: the
//     second delivery waits on the record and is a duplicate, or, joined
//     to a subscriber transaction the deadline rolled back, runs the
//     effect the first one cannot commit. RabbitMQ before 3.12 has no
//     consumer timeout of a queue's own: the broker is made to do what it
//     does when the timeout passes, close the holding consumer's channel
//     with PRECONDITION_FAILED and requeue (see amqp_deadline_test.go).
//     Not applicable to gochannel (no deadline) and Kafka (its
//     counterpart is the rebalance).
//   - 13 consumer rebalance (Kafka, Backend.GroupState): a handler of
//     every partition of the first member is held when a second member
//     joins; once the group is rebalancing they are released, and the
//     partitions move. Exactly one effect; the joining member handles
//     messages of a partition that moved.
//   - 14 slow store, fail-closed and fail-open: the test-owned proxy in
//     front of the store delays every byte by more than StoreTimeout
//     (testkit.Proxy.SetLatency) until the middleware felt it, then is
//     fast again; calls time out at the client while the store still acts
//     on them. Fail-closed: a handler held across the start of the
//     slowness completes through it; nothing lost, nothing doubled (a
//     Complete that gave up after CompleteTimeout would be the documented
//     exception, counted). Fail-open (lease mode only): bypasses counted,
//     each event doubled at most once per run of it that bypassed the
//     store. Not applicable to an embedded store (memstore, SQLite).
//
// A scenario waits until every published copy of every message was
// handled and acked and nothing is in flight, then reads the ledger; when
// everything was acked and an effect is still missing after 15 seconds,
// it reports it as lost.
//
// What depends on time is judged by the time the store saw. Every store
// call of a delivery goes through a probe that notes when it was sent and
// when it returned, which bounds when the store acted. A claim is held to
// the Store contract only where those bounds decide it: a takeover must
// be reported when the claim surely came within one lease of the expired
// lease's end, a redelivery surely inside the retention window must be a
// duplicate and one surely after it must run again; a claim too close to
// such a boundary may go either way and is counted. The scenarios are
// arranged so that their claims normally land well inside the bounds (a
// hung event's takeover copy on a shard where nothing hangs; in-window
// redeliveries republished at once when a stall delayed the first ones),
// and no assertion is about how long anything took.
//
// # How crashes happen
//
// The crash scenario kills consumers in the most realistic way the pair
// allows (Features decide):
//
//   - Restartable backend and MultiProcess store (Kafka, RabbitMQ, NATS
//     JetStream, Redis Streams or watermill-sql with Redis, NATS or a SQL
//     server): each consumer is a child
//     process — the test binary re-run with -test.run selecting the
//     scenario and the spec in the ACCEPTANCE_CHILD variable — that reports
//     what it does on a pipe; the test SIGKILLs it at the crash point and
//     starts the next one in the same group. A killed Kafka member's
//     partitions move after its session timeout; RabbitMQ requeues its
//     unacked messages; JetStream redelivers them once the consumer's
//     AckWait ran out; another member of a Redis Streams group claims the
//     entries left pending once they were idle for the claim idle time;
//     the database rolls its open transactions back.
//   - Persistent backend otherwise (an in-process store such as memstore):
//     the consumer's process state is killed (its store calls fail, its
//     open transactions roll back, it applies no more effects) and its
//     subscriber is closed without acking, so the broker redelivers to the
//     next consumer of the group.
//   - Neither (gochannel): the crash is emulated inside the consumer and
//     the message is nacked, as a broker redelivers after a consumer's
//     connection dies.
//
// # Adding a broker
//
// Write a Backend (see kafka_test.go, amqp_test.go, nats_test.go,
// redisstream_test.go, sqlpubsub_test.go, gochannel_test.go) and add it to
// TestAcceptance:
//
//   - Setup starts what the scenario needs (an in-process broker) and
//     returns an Env: strings only, since a Restartable backend is
//     re-opened from it in child processes. Put the host:port of a network
//     service under EnvAddr when the backend shares the store's service
//     (watermill-sql on the store's database): the outage scenario then
//     cuts both.
//   - CreateTopic creates a topic and registers its removal with
//     t.Cleanup; RemoveGroup removes a consumer group's state (an AMQP
//     queue, a Kafka group). Every name the suite passes is unique to the
//     scenario.
//   - NewPublisher and NewSubscriber(group) build clients from the Env.
//     Subscribers of one group must share messages (or set
//     ConsumerGroups false: every subscriber then gets every message).
//   - Route messages by MetadataShard when the backend has shards
//     (Features.Shards), so a duplicate on the next shard reaches another
//     consumer; set Ordered, Persistent and Restartable only when true.
//   - Set Native when the broker has a client of its own that producers
//     which are not Watermill use (Sarama, amqp091, plain INSERTs); the
//     foreign-producer scenario is not applicable without it.
//     Native.NewPublisher returns that client as a NativePublisher, which
//     publishes a NativeMessage as such a producer does: no Watermill UUID
//     header, the producer's id (NativeMessage.ID) where its producers put
//     it (a record key and header, the message_id property, the uuid
//     column) and its time where the broker carries one. Native.Key is
//     the key the broker's key function package documents for the
//     producer's id, and must return exactly NativeMessage.ID;
//     Native.NewSubscriber, when set, builds the subscriber with the
//     settings such messages need (amqpkeys.Marshaler,
//     sqlkeys.SchemaAdapter). Optionally: OtherKeys, more documented keys
//     of the id, checked but not claimed; CopyKey, the broker's key of one
//     published copy (kafkakeys.KafkaOffset, sqlkeys.Offset), checked to
//     be stable across redeliveries; PublishedAt, the producer's publish
//     time (kafkakeys.PublishedAt, amqpkeys.PublishedAt, or
//     middleware.MetadataTime on a time the producer writes into a row's
//     metadata), which the consumer uses for the ttl-miss check. See
//     kafka_test.go, amqp_test.go and sqlpubsub_test.go.
//   - Set Deadline to the subscriber's own deadline for a delivery, after
//     which it delivers the message again under a running handler (its
//     Name, and Prepare when the deadline is a setting of the queue or
//     the consumer, or one the broker cannot be given), or to None with
//     the reason it has none. Set GroupState when the members of a group
//     own shards that move when one joins (a Kafka consumer group).
//
// Run it with every scenario and the store that suits it (Redis in lease
// mode for a network broker), and through scenarios 1-4, 6 and 11-14
// with every store if it is the embedded default of a deployment.
//
// # Adding a store
//
// Write a Store (see stores_test.go, which opens this module's stores
// with anystore.OpenStore): Setup provisions names unique to the scenario
// id (a table, a key prefix), registers their removal and returns an Env
// with EnvAddr set when a network service is behind it; Open connects from
// the Env (dialing Env[EnvAddr], which the outage scenario replaces with a
// proxy) and registers the closing of its client. For transactional mode
// set Transactional and return a Ledger that writes in the inbox
// transaction found in the handler's context (ledger.SQL). Set
// MultiProcess when every process opening the Env shares the records.
// Set AsyncComplete to run the middleware with
// middleware.Config.AsyncComplete (see redis-async).
// Set SingleWriter when the store runs one transaction at a time
// (SQLite). Add it to stores() in matrix_test.go: it then runs scenarios
// 1-4, 6 and 11-14 on gochannel and on Kafka.
package acceptance
