package acceptance

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Env holds the settings a backend or a store needs to connect: addresses,
// DSNs, table names, key prefixes. Values are strings so that they cross a
// process boundary: a Restartable backend and a MultiProcess store are
// re-opened from their Env in child consumer processes.
type Env map[string]string

// EnvAddr is the Env key of the host:port of the network service behind a
// store (or a backend). The outage scenario puts a test-owned TCP proxy in
// front of it and re-opens the store with EnvAddr set to the proxy, so
// Store.Open (and a backend's constructors, see Backend) must dial
// env[EnvAddr] rather than a fixed address. A store without it (memstore,
// SQLite) has no network to cut and does not run the outage scenario.
const EnvAddr = "addr"

// Clone returns a copy of e that can be modified.
func (e Env) Clone() Env {
	c := make(Env, len(e))
	for k, v := range e {
		c[k] = v
	}
	return c
}

// Features says what a backend can do. It decides which strategy a
// scenario uses (how a consumer crashes, how duplicates meet), never
// whether the guarantee is checked: every backend runs every scenario.
type Features struct {
	// ConsumerGroups: subscribers created with the same group share the
	// messages of a topic (competing consumers: Kafka consumer groups,
	// an AMQP queue, a watermill-sql consumer group). Without it every
	// subscriber receives every message (gochannel's fan-out), and the
	// concurrency scenarios use fan-out subscribers sharing one dedup scope.
	ConsumerGroups bool

	// Persistent: a message that a subscriber received but did not ack
	// before it was torn down is delivered to the next subscriber of the
	// same group. The crash scenario then kills consumers for real;
	// without it (gochannel) a crash is emulated inside one consumer: the
	// crashed delivery's process state is dropped and the message is
	// nacked, as a broker redelivers after a consumer's connection dies.
	Persistent bool

	// Ordered: messages of one shard (see MetadataShard) are delivered in
	// publish order, a nacked message before the next one of its shard.
	// The nack scenario then also checks that first effects keep that
	// order.
	Ordered bool

	// Restartable: the backend is reachable from another process given
	// its Env (a broker over the network, not an in-process channel). The
	// crash scenario then runs its consumers as child processes of the
	// test binary and SIGKILLs them, when the store is MultiProcess too.
	Restartable bool

	// Shards is the number of independently consumed shards of a topic
	// (Kafka partitions). Scenarios that need a duplicate to reach another
	// consumer than its original put it on another shard. 0 means one.
	Shards int
}

// Backend is a Watermill pub/sub under test.
//
// The suite calls Setup once per scenario in the test process, then
// CreateTopic for every topic the scenario uses, then NewPublisher and
// NewSubscriber as often as it needs consumers (also in child processes,
// for a Restartable backend, with the Env that Setup returned). It closes
// every publisher and subscriber it creates; everything else (brokers,
// topics, queues, tables) is removed by the t.Cleanup functions that
// Setup and CreateTopic register.
type Backend struct {
	// Name names the backend in test names and the summary.
	Name string

	// RaceUnsafe, when set, says why the backend's own client has a data
	// race: under the race detector, which fails every test running when
	// it reports one, its scenarios are not applicable (the summary says
	// why), and .ci/run runs them again without the detector.
	RaceUnsafe string

	// Features says what the backend can do.
	Features Features

	// Setup prepares the backend for one scenario: it may start an
	// in-process broker (kfake) and registers its shutdown with t.Cleanup.
	// It returns what the constructors need. Optional: nil means an empty
	// Env.
	//
	// When the returned Env has EnvAddr equal to the store's (watermill-sql
	// on the store's own database), the outage scenario routes the backend
	// through the same proxy: a shared database fails as a whole.
	Setup func(t *testing.T) (Env, error)

	// CreateTopic creates topic (Kafka topic with Features.Shards
	// partitions, SQL tables) and registers the removal of everything the
	// backend creates for it, queues of every consumer group included.
	// Optional.
	CreateTopic func(t *testing.T, env Env, topic string) error

	// NewPublisher returns a publisher. Required.
	NewPublisher func(t testing.TB, env Env) (message.Publisher, error)

	// NewSubscriber returns a subscriber in consumer group group. Required.
	// For a backend whose subscribers create their queue on Subscribe
	// (AMQP), the suite subscribes every group before it publishes.
	NewSubscriber func(t testing.TB, env Env, group string) (message.Subscriber, error)

	// RemoveGroup removes what the backend keeps for a consumer group of
	// topic (an AMQP queue, a Kafka group's committed offsets). The suite
	// calls it in the test process, once every consumer of the scenario
	// stopped, for every group it used, including the groups of child
	// consumer processes. Optional.
	RemoveGroup func(t testing.TB, env Env, topic, group string) error

	// Native is the broker's own client, for the ForeignProducer
	// scenario: messages from a producer that is not Watermill. Optional:
	// nil makes that scenario not applicable (gochannel, whose only
	// producer is Watermill's publisher).
	Native *Native

	// Deadline is the subscriber's own deadline for a delivery, after
	// which the pub/sub gives it up and delivers it again under a handler
	// still running: watermill-sql's AckDeadline, JetStream's AckWait, the
	// idle time after which another member of a Redis Streams group claims
	// a pending entry, RabbitMQ's consumer timeout. The SubscriberDeadline
	// scenario outlives it. Optional: nil, or Deadline.None, makes that
	// scenario not applicable.
	Deadline *Deadline

	// GroupState reports the state of a consumer group whose members are
	// assigned shards, which move between them when a member joins or
	// leaves (a Kafka consumer group). The ConsumerRebalance scenario
	// watches it. Optional: nil makes that scenario not applicable (the
	// members of a queue's group take messages from it, none owns a
	// shard).
	GroupState func(t testing.TB, env Env, group string) (GroupState, error)
}

// Deadline describes a subscriber's deadline for a delivery (see
// Backend.Deadline).
type Deadline struct {
	// Name names the deadline and its length in the summary ("JetStream
	// AckWait 5s").
	Name string

	// None, when set, says why the pub/sub has no such deadline: the
	// scenario is then not applicable, for this reason.
	None string

	// Prepare, when set, is called in the test process before the
	// scenario's consumers start. It returns the Env their subscribers are
	// built from (the deadline set, where it is a setting of the queue or
	// the consumer), the deadline's name for the summary, and expire: nil
	// when the pub/sub enforces the deadline itself; otherwise the broker
	// cannot be given one (RabbitMQ before 3.12), and expire does what the
	// broker does when it passes — the scenario calls it once a handler
	// holds. It registers what it opens with t.Cleanup. Optional.
	Prepare func(t *testing.T, env Env) (subEnv Env, name string, expire func(), err error)
}

// GroupState is what Backend.GroupState reports of a consumer group.
type GroupState struct {
	// Members is the number of members the group has, joined or joining.
	Members int
	// Rebalancing: the group is moving its shards between its members
	// (Kafka's PreparingRebalance and CompletingRebalance states).
	Rebalancing bool
}

// Native describes how a producer that is not Watermill publishes to a
// backend with the broker's own client (Sarama, amqp091, plain SQL
// INSERTs), and how a Watermill consumer keys what it publishes, as the
// key function packages document for that broker.
type Native struct {
	// Client names the native client in the summary ("sarama
	// SyncProducer"). Required.
	Client string

	// NewPublisher returns the native client as a producer. The suite
	// calls Publish one message at a time and closes it. Required.
	NewPublisher func(t testing.TB, env Env) (NativePublisher, error)

	// NewSubscriber returns a Watermill subscriber in consumer group group
	// set up for other producers' messages (amqpkeys.Marshaler as the
	// marshaler, sqlkeys.SchemaAdapter as the schema adapter). Optional:
	// nil means Backend.NewSubscriber.
	NewSubscriber func(t testing.TB, env Env, group string) (message.Subscriber, error)

	// Key is the documented key of such a message, the producer's own id
	// (kafkakeys.RecordKey(), keyfuncs.MessageID() on the AMQP
	// message_id or the SQL uuid column): for a message published as
	// NativeMessage m it must return exactly one key, m.ID. The consumer
	// claims it together with the business key. KeyName names it in the
	// summary. Required.
	Key     keyfuncs.KeyFunc
	KeyName string

	// OtherKeys are other documented keys of the producer's id
	// (keyfuncs.Metadata on a header the producer sets,
	// amqpkeys.MessageID()). The consumer does not claim them; the
	// scenario checks that each returns m.ID as well. Optional.
	OtherKeys map[string]keyfuncs.KeyFunc

	// CopyKey keys the published copy itself, where the broker numbers
	// them (kafkakeys.KafkaOffset(), sqlkeys.Offset()): every
	// redelivery of a copy must give the same key, and every copy (a
	// republish under the same id too) another one. CopyKeyName names it.
	// Optional.
	CopyKey     keyfuncs.KeyFunc
	CopyKeyName string

	// PublishedAt reads the time the producer published a message
	// (kafkakeys.PublishedAt, amqpkeys.PublishedAt, or
	// middleware.MetadataTime on a time the producer writes into the
	// metadata). The consumer uses it as middleware.Config.PublishedAt.
	// It must read NativeMessage.At, to the broker's precision (at worst
	// a second); for a message published with a zero At it may report no
	// time, or the time the broker or the client stamped on it. A backend
	// with no way to carry such a time leaves it nil. Optional.
	PublishedAt func(msg *message.Message) (time.Time, bool)
}

// NativePublisher publishes as a producer that is not Watermill: no
// Watermill UUID header, the broker's own properties and headers.
type NativePublisher interface {
	// Publish publishes m to topic (the topic CreateTopic created) and
	// returns once the broker has it (a synchronous produce, a publisher
	// confirm, a committed INSERT).
	Publish(topic string, m NativeMessage) error
	Close() error
}

// NativeMessage is one message of a native producer.
type NativeMessage struct {
	// ID is the producer's own id of the message, a UUID (36 characters,
	// as watermill-sql's uuid column allows). The producer puts it where
	// its broker's producers do: the record key and an id header (Kafka),
	// the message_id property (AMQP), the uuid column (SQL). A republish
	// of the same message keeps it; the same event republished as a new
	// message gets a new one.
	ID string

	// Payload is the body, a JSON object carrying the event's business
	// key.
	Payload []byte

	// At is the producer's publish time: the record timestamp (Kafka),
	// the timestamp property (AMQP), a time in the row's metadata (SQL).
	// Zero: the producer sets none (Sarama then stamps the send time; an
	// AMQP message has no timestamp, a row no metadata).
	At time.Time
}

// Store is a dedup store under test, in one mode.
type Store struct {
	// Name names the store in test names and the summary.
	Name string

	// Transactional runs the middleware in transactional inbox mode
	// (middleware.Config.Transactional): Open must return a store
	// implementing stores.Inbox and a Ledger that writes effects in the
	// handler's transaction.
	Transactional bool

	// MultiProcess: every process that opens the same Env shares the
	// records (Redis, a SQL server). The crash scenario SIGKILLs child
	// consumer processes only for such stores on Restartable backends.
	MultiProcess bool

	// AsyncComplete runs the middleware with middleware.Config.AsyncComplete:
	// a message is acked as soon as its handler succeeds and its Complete
	// lands in the background. The suite then builds every consumer's
	// middleware with middleware.NewMiddleware and Closes it once the
	// consumer's router stopped (a child process too, on a graceful stop;
	// a SIGKILLed one skips it, as a crashed process does). The assertions
	// follow the mode's guarantee: a crash after the ack, before the
	// Complete landed, leaves the record processing like a crash between
	// effect and Complete, so the crash scenario counts such deliveries in
	// its window of possible duplicates; a Complete that gave up after the
	// ack counts as acked after a failed Complete. Scenarios that check
	// Complete outcomes stop their consumers first, so every Complete in
	// flight has landed. It cannot be combined with Transactional.
	AsyncComplete bool

	// JoinsSubscriberTx: a Transactional store whose Begin joins the
	// backend's subscriber transaction (sqlstore.Config.JoinTx on
	// watermill-sql). Its commit releases a savepoint; the subscriber's
	// transaction decides what stays, and rolls back, record, effect and
	// all, when a delivery outlives the backend's deadline. The lease
	// expiry scenario then counts a stalled run's commit that the rollback
	// undid as well as the one that stayed.
	JoinsSubscriberTx bool

	// SingleWriter: the store runs one transaction at a time (SQLite: one
	// connection). In transactional mode a handler that holds its
	// transaction holds every other delivery's Begin back: the lifecycle
	// scenarios then hold one handler at a time.
	SingleWriter bool

	// Setup provisions the store for one scenario, with names unique to id
	// (a table, a key prefix; id is lowercase letters and digits), and
	// registers their removal with t.Cleanup. It returns what Open needs,
	// with EnvAddr set for a store behind a network service. It runs in
	// the test process only. Optional.
	Setup func(t *testing.T, id string) (Env, error)

	// Open connects to the store described by env. It registers the
	// closing of what it opened with t.Cleanup. It may be called several
	// times per scenario (the outage scenario opens a store through a
	// proxy; child processes open their own). Required.
	Open func(t testing.TB, env Env) (Opened, error)
}

// Opened is what Store.Open returns.
type Opened struct {
	// Store keeps the dedup records. The suite closes it.
	Store stores.Store

	// Ledger counts the scenario's effects in the store's database, written
	// in the handler's transaction. Required for a Transactional store;
	// nil otherwise, and the suite counts effects in memory.
	Ledger Ledger
}

// Ledger counts the side effects of the handlers under test: one effect
// per delivery that applied it, named by the logical event it belongs to
// (ledger.Effect.Event; the suite sets nothing else). The invariant of
// every scenario is that each event has exactly one effect. For a
// transactional store, Record writes in the transaction that ctx carries
// (sqlstore.TxFromContext), so the effect commits or rolls back with the
// dedup record: ledger.SQL with RequireTx does.
type Ledger = ledger.Ledger

func (b Backend) validate() error {
	switch {
	case b.Name == "":
		return errors.New("acceptance: Backend.Name is required")
	case b.NewPublisher == nil:
		return fmt.Errorf("acceptance: backend %s: NewPublisher is required", b.Name)
	case b.NewSubscriber == nil:
		return fmt.Errorf("acceptance: backend %s: NewSubscriber is required", b.Name)
	case b.Features.Shards < 0:
		return fmt.Errorf("acceptance: backend %s: Features.Shards must not be negative, got %d", b.Name, b.Features.Shards)
	case b.Native != nil && (b.Native.Client == "" || b.Native.NewPublisher == nil || b.Native.Key == nil):
		return fmt.Errorf("acceptance: backend %s: Native needs Client, NewPublisher and Key", b.Name)
	}
	return nil
}

func (s Store) validate() error {
	switch {
	case s.Name == "":
		return errors.New("acceptance: Store.Name is required")
	case s.Open == nil:
		return fmt.Errorf("acceptance: store %s: Open is required", s.Name)
	case s.AsyncComplete && s.Transactional:
		return fmt.Errorf("acceptance: store %s: AsyncComplete cannot be combined with Transactional", s.Name)
	}
	return nil
}

func (f Features) shards() int {
	if f.Shards < 1 {
		return 1
	}
	return f.Shards
}

// Run runs the scenarios (all of them when only is empty) for backend b
// and store s, each as a parallel subtest named "<b.Name>+<s.Name>/<n>_<scenario>",
// and records each outcome for the summary (see WriteSummary). A scenario
// that cannot apply to the pair (the outage scenario on a store without a
// network) is not run and is listed in the summary with the reason.
//
// Run also is the entry point of child consumer processes: a test binary
// started by the crash scenario runs the same test, and Run turns the one
// matching subtest into a consumer.
func Run(t *testing.T, b Backend, s Store, only ...Scenario) {
	t.Helper()
	if err := b.validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := eventsFromEnv(); err != nil {
		t.Fatal(err)
	}
	if len(only) == 0 {
		only = Scenarios()
	}
	child := childSpecFromEnv()
	t.Run(b.Name+"+"+s.Name, func(t *testing.T) {
		if child == nil {
			t.Parallel()
		}
		for _, sc := range only {
			t.Run(sc.slug(), func(t *testing.T) {
				if child != nil {
					runChild(t, b, s, child)
					return
				}
				if reason := notApplicable(b, s, sc); reason != "" {
					// Not a skip: nothing is missing, the scenario has no
					// meaning for this pair. The summary says why.
					t.Logf("not applicable: %s", reason)
					recordNotApplicable(b, s, sc, reason)
					return
				}
				t.Parallel()
				runScenario(t, b, s, sc)
			})
		}
	})
}

// notApplicable returns why sc cannot run for (b, s), or "". A store
// with a Setup is asked at run time instead (see errNoNetwork).
func notApplicable(b Backend, s Store, sc Scenario) string {
	switch {
	case b.RaceUnsafe != "" && raceDetector:
		return "not under the race detector: " + b.RaceUnsafe + " (.ci/run runs this backend again without -race)"
	case sc == StoreOutage && s.Setup == nil:
		return noNetworkReason
	case sc == ForeignProducer && b.Native == nil:
		return noNativeReason
	case sc == SubscriberDeadline && b.Deadline == nil:
		return noDeadlineReason
	case sc == SubscriberDeadline && b.Deadline.None != "":
		return b.Deadline.None
	case sc == ConsumerRebalance && !b.Features.ConsumerGroups:
		return "no consumer groups: every subscriber gets every message, there is no shard to move"
	case sc == ConsumerRebalance && b.GroupState == nil:
		return noRebalanceReason
	case sc == SlowStore && s.Setup == nil:
		return noSlowNetworkReason
	}
	return ""
}

const (
	noNetworkReason     = "embedded store: no network connection to cut (not a service skip)"
	noSlowNetworkReason = "embedded store: no network connection to slow down (not a service skip)"
	noNativeReason      = "no native client: every producer of this pub/sub is Watermill's publisher (Backend.Native is nil)"
	noDeadlineReason    = "the subscriber has no deadline of its own for a delivery (Backend.Deadline is nil)"
	noRebalanceReason   = "no consumer-group rebalance: the members of a group take messages from one queue, none owns a shard that could move (Backend.GroupState is nil)"
)

// DefaultEvents is the base number of events of a scenario.
const DefaultEvents = 200

// Events returns the base number of events per scenario: the
// ACCEPTANCE_EVENTS environment variable, or DefaultEvents. Scenarios scale
// it down where each event is slow (crashes, lease expiries) and never go
// below a minimum of their own; set it to 100000 for a soak run. Any
// positive integer is valid; Run fails on anything else, and Events then
// returns DefaultEvents.
func Events() int {
	n, err := eventsFromEnv()
	if err != nil {
		return DefaultEvents
	}
	return n
}

func eventsFromEnv() (int, error) {
	v := os.Getenv("ACCEPTANCE_EVENTS")
	if v == "" {
		return DefaultEvents, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("acceptance: ACCEPTANCE_EVENTS=%q: want a positive integer (the base number of events per scenario, default %d)", v, DefaultEvents)
	}
	return n, nil
}

// events returns Events()/div, at least minimum.
func events(div, minimum int) int {
	return max(Events()/div, minimum)
}
