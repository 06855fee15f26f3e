package acceptance

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Scenario is one of the suite's scenarios. Every scenario checks the
// invariant: each logical event has exactly one effect in the ledger
// (Retention documents its one exception).
type Scenario int

// The scenarios, numbered as in the issue that specified them.
const (
	// NackRedelivery: each event's first attempt fails (every fifth by a
	// panic, recovered by Watermill's Recoverer); the redelivery applies
	// it. In transactional mode the failing attempt writes its effect
	// first, and the rollback must take it away. On an Ordered backend the
	// first effects of each shard keep the publish order.
	NackRedelivery Scenario = iota + 1

	// ConsumerCrash: consumers die after their side effect, before
	// Complete (or the commit), or after Complete, before the ack; a new
	// consumer of the same group takes over. Transactional mode: no
	// duplicate effect. Lease mode: the duplicates are at least the
	// crashes planned between effect and Complete, and at most the
	// deliveries any crash caught between effect and Complete (counted at
	// each kill); each claim such a crash left is claimed again only once
	// its lease ran out, as a takeover that the middleware reports (a
	// claim that came more than one lease later may be a fresh one: the
	// store may have forgotten the expired claim). How a consumer dies
	// depends on the backend: a child process SIGKILLed (Restartable
	// backend, MultiProcess store), a subscriber torn down without acking
	// (Persistent backend), or an emulated crash whose message is nacked
	// (gochannel).
	ConsumerCrash

	// ConcurrentDuplicates: three consumers of one group (of one scope
	// over fan-out subscribers when the backend has no groups) and a
	// quarter of the events published twice with the same message id, the
	// copy on another shard: no double effect.
	ConcurrentDuplicates

	// ProducerRepublish: a fifth of the events is published again under a
	// new message id; the key keyfuncs.All(MessageID(), JSON("event_id"))
	// makes it one effect.
	ProducerRepublish

	// LeaseExpiry: three events' first attempt hangs past its lease, its
	// heartbeats kept from the store as a stalled process's would be (the
	// other events' heartbeats go on); a duplicate delivery (on a shard
	// where nothing hangs) takes the lease over and applies the effect;
	// the stalled run then checks its claim before its effect (a fenced
	// write), skips it, and its Complete is refused: exactly one Complete
	// wins. The store lets no other claim in before the lease ran out, and
	// reports the takeover (Claim.Takeover, counted by the middleware)
	// when it came within one more lease, as long as the Store contract
	// keeps an expired claim; a later claim may be a fresh one, which the
	// scenario counts. Transactional mode has no lease: the duplicate
	// waits on the record's lock until the stalled transaction commits,
	// then is a duplicate: exactly one commit wins.
	LeaseExpiry

	// StoreOutage: a test-owned TCP proxy in front of the store is cut
	// mid-stream and restored. Fail-closed: nothing lost, nothing doubled,
	// store errors counted, no bypass. Fail-open (lease mode only): the
	// stream goes on during the outage, bypasses are counted, and with no
	// redelivery during the outage nothing is doubled. When the backend
	// uses the store's database (watermill-sql), both go through the
	// proxy.
	StoreOutage

	// BadInput: messages without the business key and with a non-JSON
	// payload go to a poison queue (Watermill's PoisonQueueWithFilter with
	// dedup.IsPermanent) and the stream continues; the poisoned
	// messages, fixed, are replayed and applied once; already processed
	// messages replayed from a dead-letter topic are dropped as
	// duplicates.
	BadInput

	// Outputs: the handler produces one message per event and the router's
	// publisher fails half of the time (before or after publishing). Every
	// output is published at least once, with one stable UUID, and a
	// downstream consumer deduplicating by message id applies it once.
	Outputs

	// Retention: with a short retention window, a redelivery inside the
	// window is a duplicate, and one after it is processed again and
	// counted as a ttl miss (dedup.OutcomeTTLMiss). That second
	// effect is the documented cost of a window shorter than the broker's
	// redelivery horizon: it is the one expected exception to the
	// invariant, and the scenario asserts it happens exactly for the late
	// redeliveries. Inside or after is what the store saw: the probe
	// bounds when the store made each record done and when it saw each
	// claim, a claim surely inside the window must be a duplicate, one
	// surely after it must run again, and one too close to the window's
	// end to tell may be either (and is counted). A redelivery
	// that a stalled machine delayed past the window is such a late one;
	// the scenario then republishes more events as soon as they are done,
	// until a fifth of its events' redeliveries surely met a live record.
	Retention

	// ForeignProducer: the producer is the broker's native client
	// (Backend.Native), not Watermill's publisher, so messages carry no
	// Watermill UUID: Kafka records keyed by the producer's id with an id
	// header, AMQP messages with the message_id property and non-string
	// headers, rows INSERTed into watermill-sql's table. The consumer
	// uses the subscriber settings for such messages and keys them by
	// the broker's documented key of the producer's id together with the
	// business key (keyfuncs.All with keyfuncs.JSON("event_id")). Each
	// event's first attempt fails, so every event is redelivered; a fifth
	// is republished under the same producer id and a fifth as a new
	// message (a new producer id) that only the business key catches,
	// half of each at once and half at the end. The scenario checks that
	// the documented keys return the producer's id on every delivery,
	// that the broker's copy key (Native.CopyKey) is stable across
	// redeliveries and new for every copy, and that the publish time
	// (Native.PublishedAt) is read as the producer set it (a fourth of
	// the events are sent without one): no ttl miss for a fresh message,
	// one for each claim of an event published two hours before (the
	// retention is an hour). A delivery is matched to what was published
	// by the payload's own "message_id" field, not by the key functions
	// under test.
	ForeignProducer

	// GracefulShutdown: the router is closed (router.Close, as in a
	// deploy) while handlers run, held mid-effect: one before its effect
	// that watches its context and returns ctx.Err() when it ends, one
	// before its effect that finishes it whatever becomes of its context,
	// one after its effect that finishes; in transactional mode also one
	// after its effect that returns ctx.Err() (the rollback takes the
	// effect away; in lease mode that would be a handler's bug). Once the
	// router began closing, the finishing ones are released, and the
	// watching ones return when their context ends (every pub/sub of the
	// matrix ends it as its router closes); then a new consumer of the
	// same group resumes the subscription. Every event has exactly one
	// effect, and every run that finished recorded its event done
	// whatever became of its message's context (the Complete detached
	// from it in lease mode, flushed by the middleware's Close under
	// AsyncComplete; a joined savepoint excepted, which the subscriber's
	// rollback undoes when its deadline passed meanwhile): its redelivery,
	// when the ack did not reach the broker, is a duplicate. As many
	// handlers are held at once as one consumer runs at once (a partition
	// each on Kafka, every message on gochannel, one delivery at a time on
	// a queue or watermill-sql, one transaction at a time on SQLite); the
	// rest are held by the next consumers, one shutdown each. A backend
	// that keeps nothing for a closed subscriber (gochannel) has what it
	// left unacked published again, as a persistent broker redelivers
	// it. A claim the closing router cut in flight is given back by the
	// middleware as soon as the store answers it: with the default lease
	// of minutes, no key may wait for its lease (no takeover).
	GracefulShutdown

	// SubscriberDeadline: a handler outlives the subscriber's own deadline
	// for its delivery (Backend.Deadline: watermill-sql's AckDeadline,
	// JetStream's AckWait, Redis Streams' claim by another member,
	// RabbitMQ's consumer timeout), while its lease stays valid (the
	// heartbeat extends it): the pub/sub delivers the message again under
	// the running handler. Lease mode: the second delivery finds it
	// InProgress, and once the handler is released it ends as a
	// duplicate; the only double allowed is the documented takeover of a
	// lease the probe saw run out. Transactional mode: the second delivery
	// waits on the record and is a duplicate once the first commits, or,
	// joined to a subscriber transaction the deadline rolled back, runs
	// the effect that the first one's commit then cannot keep: exactly one
	// effect. Not applicable without such a deadline (gochannel; Kafka,
	// whose counterpart is ConsumerRebalance).
	SubscriberDeadline

	// ConsumerRebalance: a handler of every shard of the first member of a
	// group is held mid-flight (before or after its effect) when a second
	// member joins; once the group is rebalancing the handlers are
	// released, and the shards move: the joining member takes some over,
	// with the held messages whose offsets were not committed. Exactly one
	// effect per event; the joining member handles messages of a shard
	// that moved. Kafka only (Backend.GroupState).
	ConsumerRebalance

	// SlowStore: a test-owned TCP proxy in front of the store delays every
	// byte (testkit.Proxy.SetLatency), so that store calls take longer
	// than StoreTimeout without failing at the store, for a while, then it
	// is fast again. Fail-closed: a handler held across the start of the
	// slowness completes its record through it; nothing lost, nothing
	// doubled, no bypass. Fail-open (lease mode only): the stream goes on,
	// bypasses are counted, and an event runs at most once more than once
	// per bypassed run of it (a bypassed run leaves no record), the bound
	// the guarantee table states. Not applicable to an embedded store.
	SlowStore
)

var scenarioNames = [...]string{
	NackRedelivery:       "nack_redelivery",
	ConsumerCrash:        "consumer_crash",
	ConcurrentDuplicates: "concurrent_duplicates",
	ProducerRepublish:    "producer_republish",
	LeaseExpiry:          "lease_expiry",
	StoreOutage:          "store_outage",
	BadInput:             "bad_input",
	Outputs:              "outputs",
	Retention:            "retention",
	ForeignProducer:      "foreign_producer",
	GracefulShutdown:     "graceful_shutdown",
	SubscriberDeadline:   "subscriber_deadline",
	ConsumerRebalance:    "consumer_rebalance",
	SlowStore:            "slow_store",
}

// Scenarios returns every scenario, in order.
func Scenarios() []Scenario {
	out := make([]Scenario, 0, len(scenarioNames)-1)
	for s := NackRedelivery; int(s) < len(scenarioNames); s++ {
		out = append(out, s)
	}
	return out
}

func (s Scenario) String() string {
	if s > 0 && int(s) < len(scenarioNames) {
		return scenarioNames[s]
	}
	return "scenario_" + strconv.Itoa(int(s))
}

// slug is the subtest name: "1_nack_redelivery".
func (s Scenario) slug() string { return strconv.Itoa(int(s)) + "_" + s.String() }

func (s Scenario) label(variant string) string {
	if variant == "" {
		return s.slug()
	}
	return s.slug() + "/" + variant
}

func runScenario(t *testing.T, b Backend, s Store, sc Scenario) {
	switch sc {
	case NackRedelivery:
		scenarioNack(t, b, s)
	case ConsumerCrash:
		scenarioCrash(t, b, s)
	case ConcurrentDuplicates:
		scenarioConcurrent(t, b, s)
	case ProducerRepublish:
		scenarioRepublish(t, b, s)
	case LeaseExpiry:
		scenarioLease(t, b, s)
	case StoreOutage:
		t.Run("fail_closed", func(t *testing.T) {
			t.Parallel()
			scenarioOutage(t, b, s, false)
		})
		if s.Transactional {
			recordRow(Row{Broker: b.Name, Store: s.Name, Scenario: sc.label("fail_open"), Result: ResultNotApplicable,
				Note: "fail-open cannot be combined with transactional mode (middleware.Config.Validate)"})
			return
		}
		t.Run("fail_open", func(t *testing.T) {
			t.Parallel()
			scenarioOutage(t, b, s, true)
		})
	case BadInput:
		scenarioBadInput(t, b, s)
	case Outputs:
		scenarioOutputs(t, b, s)
	case Retention:
		scenarioRetention(t, b, s)
	case ForeignProducer:
		scenarioForeign(t, b, s)
	case GracefulShutdown:
		scenarioGraceful(t, b, s)
	case SubscriberDeadline:
		scenarioDeadline(t, b, s)
	case ConsumerRebalance:
		scenarioRebalance(t, b, s)
	case SlowStore:
		t.Run("fail_closed", func(t *testing.T) {
			t.Parallel()
			scenarioSlowStore(t, b, s, false)
		})
		if s.Transactional {
			recordRow(Row{Broker: b.Name, Store: s.Name, Scenario: sc.label("fail_open"), Result: ResultNotApplicable,
				Note: "fail-open cannot be combined with transactional mode (middleware.Config.Validate)"})
			return
		}
		t.Run("fail_open", func(t *testing.T) {
			t.Parallel()
			scenarioSlowStore(t, b, s, true)
		})
	default:
		t.Fatalf("acceptance: unknown scenario %d", sc)
	}
}

// defaultLease is the lease of the default consumer (see spec): longer
// than its StoreTimeout.
const defaultLease = 5 * time.Minute

// spec is the default consumer of a run.
func (r *run) spec(name, topic string) consumerSpec {
	return consumerSpec{
		Name:    name,
		Handler: "acceptance",
		Group:   r.group("g"),
		Topic:   topic,
		Key:     keyMessageID,
		// Longer than StoreTimeout: a lease must not run out while a
		// Complete waits for the store, or a concurrent duplicate takes
		// it over and runs again. Scenarios about expiry set it shorter.
		// It is also CompleteTimeout, how long a failed Complete is
		// retried.
		Lease:          defaultLease,
		InProgressWait: 500 * time.Millisecond,
		InProgressPoll: 20 * time.Millisecond,
		// No budget a slow machine can exceed: on two loaded cores under
		// the race detector a store call may queue for tens of seconds
		// (SQLite's consumers take turns at its one write lock), and a
		// Complete that timed out for CompleteTimeout is acked anyway and
		// doubled by the next duplicate (the bounded duplicate of a failed
		// Complete), which the scenarios that assert exactly one effect
		// do not allow. Only the scenarios about failures set it shorter.
		StoreTimeout: 2 * time.Minute,
		RetryDelay:   10 * time.Millisecond,
	}
}

// startConsumers starts k consumers of spec sharing its group, or, on a
// backend without consumer groups, k fan-out subscribers sharing its
// dedup scope (each receives every message).
func (r *run) startConsumers(spec consumerSpec, k int) {
	r.t.Helper()
	if !r.b.Features.ConsumerGroups {
		r.mu.Lock()
		r.fanout = k
		r.mu.Unlock()
	}
	for i := 1; i <= k; i++ {
		sp := spec
		sp.Name = fmt.Sprintf("%s%d", spec.Name, i)
		if !r.b.Features.ConsumerGroups {
			sp.Group = fmt.Sprintf("%s_%d", spec.Group, i)
		}
		r.startConsumer(sp)
	}
}

// onShard returns a copy of ev on the next shard: a duplicate that reaches
// another consumer than the original on a sharded backend.
func (ev event) onShard(delta int) event {
	ev.Shard += delta
	return ev
}

// warmUp publishes warm-up events, one shard after the other, until each
// of the k consumers started with startConsumers has handled one: the
// group is then stable, each consumer holding its share of the topic, so
// no rebalance waits on a message that a scenario holds on purpose. The
// warm-up events count like any other; they are returned.
func (r *run) warmUp(topic, name string, k int) []event {
	r.t.Helper()
	shards := r.b.Features.shards()
	var evs []event
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; ; i++ {
		if r.allHandledOne(name, k) {
			return evs
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("warm-up: not every consumer handled a message after %d warm-up events", len(evs))
		}
		ev := event{ID: fmt.Sprintf("w%05d", i), UUID: watermill.NewUUID(), Shard: i % shards}
		r.mu.Lock()
		r.events++
		r.mu.Unlock()
		r.publish(topic, ev.message())
		evs = append(evs, ev)
		r.waitUntil(300*time.Millisecond, func() bool { return r.allHandledOne(name, k) })
	}
}

func (r *run) allHandledOne(name string, k int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 1; i <= k; i++ {
		if r.handledBy[fmt.Sprintf("%s%d", name, i)] == 0 {
			return false
		}
	}
	return true
}

// publishAsync publishes msg from a goroutine other than the test's.
func (r *run) publishAsync(topic string, msg *message.Message) {
	r.mu.Lock()
	r.published[msg.UUID]++
	r.due += r.fanout
	r.eventOf[msg.UUID] = msg.Metadata.Get(MetadataEvent)
	r.mu.Unlock()
	if err := r.publishOne(topic, msg); err != nil {
		r.t.Errorf("publish %s to %s: %v", msg.UUID, topic, err)
	}
}

// waitUntil polls cond for at most max and returns how long it waited.
func (r *run) waitUntil(max time.Duration, cond func() bool) time.Duration {
	start := time.Now()
	for !cond() && time.Since(start) < max {
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// notApplicable marks the run's row n/a.
func (r *run) notApplicable(reason string) {
	r.mu.Lock()
	r.na = reason
	r.mu.Unlock()
	r.t.Logf("not applicable: %s", reason)
}

// subscription reads a topic outside any router.
func (r *run) subscribe(topic, group string, handle func(*message.Message)) {
	r.t.Helper()
	r.used(topic, group)
	sub, err := r.b.NewSubscriber(r.t, r.benv, group)
	if err != nil {
		r.t.Fatalf("backend %s subscriber: %v", r.b.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		r.t.Fatalf("subscribe to %s: %v", topic, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			handle(m)
			m.Ack()
		}
	}()
	r.t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			r.t.Logf("closing the %s subscriber: %v", topic, err)
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			r.t.Errorf("the %s subscription did not stop", topic)
		}
	})
}
