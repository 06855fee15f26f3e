package acceptance

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/dedup/internal/testenv"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
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
	// each kill). How a consumer dies depends on the backend: a child
	// process SIGKILLed (Restartable backend, MultiProcess store), a
	// subscriber torn down without acking (Persistent backend), or an
	// emulated crash whose message is nacked (gochannel).
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

	// LeaseExpiry: three events' first attempt hangs past its lease with
	// heartbeats off; a duplicate delivery takes the lease over and
	// applies the effect; the stalled run then checks its claim before its
	// effect (a fenced write), skips it, and its Complete is refused:
	// exactly one Complete wins. Transactional mode has no lease: the
	// duplicate waits on the record's lock until the stalled transaction
	// commits, then is a duplicate: exactly one commit wins.
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
	// middleware.IsPermanent) and the stream continues; the poisoned
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
	// counted as a ttl miss (middleware.OutcomeTTLMiss). That second
	// effect is the documented cost of a window shorter than the broker's
	// redelivery horizon: it is the one expected exception to the
	// invariant, and the scenario asserts it happens exactly for the late
	// redeliveries.
	Retention
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
	default:
		t.Fatalf("acceptance: unknown scenario %d", sc)
	}
}

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
		Lease:          middleware.DefaultLease,
		InProgressWait: 500 * time.Millisecond,
		InProgressPoll: 20 * time.Millisecond,
		// Generous: on two shared cores under the race detector a store
		// call may queue for seconds. A timed-out Complete is acked anyway
		// and may be doubled later (the bounded duplicate of a failed
		// Complete); only the outage scenario wants store calls to fail.
		StoreTimeout: 20 * time.Second,
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

// ---- 1

func scenarioNack(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, NackRedelivery, "")
	in := r.topic("in")
	n := events(1, 20)
	evs := r.newEvents(n, "e")
	spec := r.spec("c1", in)
	spec.FailFirst = true
	c := r.startConsumer(spec)
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	effects := r.effects()
	AssertExactlyOnce(t, effects, ids(evs))
	failed := int(c.core.fails.Load())
	if failed != n {
		t.Errorf("%d first attempts failed, want one per event (%d)", failed, n)
	}
	r.note("failed first attempts=%d (panics %d), released=%d", failed, failed/5, r.outcome(middleware.OutcomeReleased))
	if b.Features.Ordered {
		shard := map[string]int{}
		for _, ev := range evs {
			shard[ev.ID] = ev.Shard
		}
		AssertFirstEffectsInOrder(t, effects, ids(evs), func(e string) int { return shard[e] })
		r.note("order checked")
	}
}

// ---- 2

type crashMode string

const (
	crashSIGKILL  crashMode = "SIGKILL of a child process"
	crashTeardown crashMode = "subscriber torn down without ack"
	crashEmulated crashMode = "emulated in-process, message nacked"
)

func crashModeOf(b Backend, s Store) crashMode {
	switch {
	case b.Features.Restartable && s.MultiProcess:
		return crashSIGKILL
	case b.Features.Persistent && b.Features.ConsumerGroups:
		return crashTeardown
	default:
		return crashEmulated
	}
}

func scenarioCrash(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, ConsumerCrash, "")
	in := r.topic("in")
	n := events(2, 24)
	evs := r.newEvents(n, "e")
	// Three crashes, more in a soak run, spread over the stream and
	// alternating between the two points.
	crashes := min(3+n/500, 12)
	plan := map[string]crashPoint{}
	for i := range crashes {
		point := crashAfterEffect
		if i%2 == 1 {
			point = crashAfterComplete
		}
		plan[evs[(i+1)*n/(crashes+1)].ID] = point
	}
	for ev := range plan {
		r.crashPlan[ev] = true
	}
	spec := r.spec("c1", in)
	// Short, as the crashed claims are taken over when it runs out, but
	// well above the latency of a loaded store: a lease that runs out under
	// a live handler would add a duplicate no crash explains.
	spec.Lease = 4 * time.Second
	spec.StoreTimeout = 3 * time.Second
	spec.Crash = plan
	mode := crashModeOf(b, s)
	r.note("crash: %s", mode)
	start := func(sp consumerSpec) {
		if mode == crashSIGKILL {
			r.startChild(sp)
		} else {
			r.startConsumer(sp)
		}
	}
	start(spec)
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	if mode != crashEmulated {
		r.replaceCrashed(len(plan), timeout(n), func(i int) {
			sp := spec
			sp.Name = fmt.Sprintf("c%d", i)
			sp.Crash = r.remainingCrashes(plan)
			start(sp)
		})
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	effects := r.effects()
	want := map[string]int{}
	for _, ev := range evs {
		want[ev.ID] = 1
	}
	extra := extraEffects(effects)
	r.mu.Lock()
	log := append([]crashRecord(nil), r.crashLog...)
	r.mu.Unlock()
	planned, window := 0, 0
	for _, c := range log {
		if c.point == crashAfterEffect {
			planned++
		}
		window += c.window
	}
	AssertAtLeast(t, "crashes", len(log), len(plan))
	r.note("crashes=%d (after effect %d), caught between effect and Complete=%d, duplicate effects=%d", len(log), planned, window, extra)
	if s.Transactional {
		AssertExactlyOnce(t, effects, ids(evs))
		return
	}
	// Lease mode: every event has an effect; the extra ones are bounded by
	// the crashes that hit between effect and Complete.
	counts := countEffects(effects)
	lost := 0
	for _, ev := range evs {
		if counts[ev.ID] == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d events lost", lost)
	}
	if len(counts) != n {
		AssertEffects(t, effects, want) // reports the unexpected ones
	}
	// A Complete that failed for good is acked anyway and its record runs
	// out like a crashed one's: it widens the window the same way.
	r.mu.Lock()
	failedCompletes := r.completeErr
	r.mu.Unlock()
	AssertBetween(t, "duplicate effects (lease mode)", extra, planned, window+failedCompletes)
	AssertAtLeast(t, "takeovers", r.outcome(middleware.OutcomeTakeover), planned)
}

// replaceCrashed kills each consumer that reports a crash and starts the
// next one (start(2), start(3), ...), until planned crashes happened. A
// consumer may report several crashes before it is killed (its deliveries
// run concurrently): the later ones are logged, and no extra consumer is
// started for them.
func (r *run) replaceCrashed(planned int, limit time.Duration, start func(i int)) {
	r.t.Helper()
	dead := map[string]bool{}
	var later []crashNote // reports of live consumers, drained early
	next := 2
	deadline := time.After(limit)
	for r.crashCount() < planned {
		var note crashNote
		if len(later) > 0 {
			note, later = later[0], later[1:]
		} else {
			select {
			case note = <-r.crashes:
			case <-deadline:
				r.t.Fatalf("timed out waiting for the planned crashes: %d of %d happened", r.crashCount(), planned)
			}
		}
		if dead[note.consumer] {
			r.crashed(note, 0) // its window was counted when it was killed
			continue
		}
		window := note.kill()
		dead[note.consumer] = true
		r.crashed(note, window)
		// The killed consumer's other reports are all in the channel now:
		// log them before the next consumer gets the remaining plan.
		for drained := false; !drained; {
			select {
			case more := <-r.crashes:
				if dead[more.consumer] {
					r.crashed(more, 0)
				} else {
					later = append(later, more)
				}
			default:
				drained = true
			}
		}
		start(next)
		next++
	}
}

func (r *run) crashCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.crashLog)
}

// crashed logs a kill; the crash of note.event happened.
func (r *run) crashed(note crashNote, window int) {
	r.logCrash(crashRecord{consumer: note.consumer, event: note.event, point: note.point, window: window})
}

// remainingCrashes is the part of plan that did not happen yet: the plan
// of the next child process.
func (r *run) remainingCrashes(plan map[string]crashPoint) map[string]crashPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]crashPoint{}
	for ev, p := range plan {
		out[ev] = p
	}
	for _, c := range r.crashLog {
		delete(out, c.event)
	}
	return out
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

// ---- 3

func scenarioConcurrent(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, ConcurrentDuplicates, "")
	in := r.topic("in")
	n := events(1, 20)
	evs := r.newEvents(n, "e")
	spec := r.spec("c", in)
	spec.Key = keyIDAndEvent
	spec.InProgressWait = time.Second
	const k = 3
	r.startConsumers(spec, k)
	warm := r.warmUp(in, spec.Name, k)
	copies := len(warm)
	for i, ev := range evs {
		r.publish(in, ev.message())
		copies++
		if i%4 == 1 {
			r.publish(in, ev.onShard(1).message())
			copies++
		}
	}
	evs = append(warm, evs...)
	r.waitSettled(len(evs), r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	r.mu.Lock()
	fanout := r.fanout
	r.mu.Unlock()
	AssertAtLeast(t, "duplicates dropped", r.outcome(middleware.OutcomeDuplicate), copies*fanout-len(evs))
	r.note("%d consumers, %d copies, in_progress=%d", k, copies, r.outcome(middleware.OutcomeInProgress))
}

// ---- 4

func scenarioRepublish(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, ProducerRepublish, "")
	in := r.topic("in")
	n := events(1, 20)
	evs := r.newEvents(n, "e")
	spec := r.spec("c1", in)
	spec.Key = keyIDAndEvent
	r.startConsumer(spec)
	var later []event
	republished := 0
	for i, ev := range evs {
		r.publish(in, ev.message())
		if i%5 != 2 {
			continue
		}
		again := ev.onShard(1)
		again.UUID = watermill.NewUUID()
		republished++
		if i%2 == 0 {
			r.publish(in, again.message())
		} else {
			later = append(later, again)
		}
	}
	for _, ev := range later {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	AssertAtLeast(t, "duplicates dropped", r.outcome(middleware.OutcomeDuplicate), republished)
	r.note("republished=%d under new ids", republished)
}

// ---- 5

func scenarioLease(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, LeaseExpiry, "")
	in := r.topic("in")
	n := events(5, 12)
	evs := r.newEvents(n, "e")
	hung := []event{evs[1], evs[n/2], evs[n-2]}
	spec := r.spec("c", in)
	spec.Lease = 1500 * time.Millisecond
	spec.Heartbeat = -1 // a stalled process sends no heartbeat
	spec.InProgressWait = 250 * time.Millisecond
	spec.Hang = map[string]bool{}
	byID := map[string]event{}
	for _, ev := range hung {
		spec.Hang[ev.ID] = true
		r.hangPlan[ev.ID] = true
		byID[ev.ID] = ev
	}
	// One consumer more than hung attempts, so a hung attempt never holds
	// the last consumer that could take it over (a queue's consumers each
	// take one message at a time).
	k := len(hung) + 1
	r.startConsumers(spec, k)
	warm := r.warmUp(in, spec.Name, k)
	// When an attempt hangs, publish its message again (same id) on
	// another shard, for another consumer to pick up.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case id := <-r.hangs:
				r.publishAsync(in, byID[id].onShard(1).message())
			case <-r.done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		r.finish()
		wg.Wait()
	})
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	evs = append(warm, evs...)
	r.waitSettled(n, r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range hung {
		if got := r.completeOK[ev.ID]; got != 1 {
			t.Errorf("hung event %s: %d successful Complete/commit, want exactly 1", ev.ID, got)
		}
		if r.enteredN[ev.ID] < 2 {
			t.Errorf("hung event %s: %d deliveries reached the store, want a second one while it hung", ev.ID, r.enteredN[ev.ID])
		}
		if !s.Transactional && r.completeLost[ev.ID] < 1 {
			t.Errorf("hung event %s: the stalled run's Complete was not refused (lost claim)", ev.ID)
		}
	}
	if !s.Transactional {
		AssertAtLeast(t, "takeovers", r.outcomes[middleware.OutcomeTakeover], len(hung))
		refused := 0
		for _, n := range r.completeLost {
			refused += n
		}
		r.notes = append(r.notes, fmt.Sprintf("hung=%d takeovers=%d stalled Completes refused=%d", len(hung), r.outcomes[middleware.OutcomeTakeover], refused))
	} else {
		r.notes = append(r.notes, fmt.Sprintf("hung=%d, each overlapped by a waiting duplicate; one commit each", len(hung)))
	}
}

// publishAsync publishes msg from a goroutine other than the test's.
func (r *run) publishAsync(topic string, msg *message.Message) {
	r.mu.Lock()
	r.published[msg.UUID]++
	r.mu.Unlock()
	if err := r.pub.Publish(topic, msg); err != nil {
		r.t.Errorf("publish %s to %s: %v", msg.UUID, topic, err)
	}
}

// ---- 6

func scenarioOutage(t *testing.T, b Backend, s Store, failOpen bool) {
	variant := "fail_closed"
	if failOpen {
		variant = "fail_open"
	}
	r := newRun(t, b, s, StoreOutage, variant)
	addr := r.senv[EnvAddr]
	if addr == "" {
		r.notApplicable(noNetworkReason)
		return
	}
	proxy := testenv.NewProxy(t, addr)
	senv := r.senv.Clone()
	senv[EnvAddr] = proxy.Addr()
	cn := conn{benv: r.benv, opened: r.open(senv)}
	shared := r.benv[EnvAddr] == addr
	if shared {
		cn.benv = r.benv.Clone()
		cn.benv[EnvAddr] = proxy.Addr()
		r.note("the backend shares the store's database: both cut")
	}
	in := r.topic("in")
	n := events(1, 60)
	evs := r.newEvents(n, "e")
	spec := r.spec("c1", in)
	spec.Lease = 3 * time.Second
	spec.StoreTimeout = time.Second
	spec.FailOpen = failOpen
	spec.RetryDelay = 20 * time.Millisecond
	r.startConsumerWith(spec, cn)

	third := n / 3
	for _, ev := range evs[:third] {
		r.publish(in, ev.message())
	}
	r.eventually("effects before the outage", timeout(third), func() (bool, string) {
		got := len(r.effectsQuiet())
		return got >= third/2, fmt.Sprintf("%d effects", got)
	})
	proxy.Cut()
	cutAt := len(r.effectsQuiet())
	for _, ev := range evs[third : 2*third] {
		r.publish(in, ev.message())
	}
	// Hold the outage until the middleware felt it (or 3s for a backend
	// that cannot consume without the database either).
	held := r.waitUntil(3*time.Second, func() bool {
		if failOpen {
			return r.outcome(middleware.OutcomeBypassed) >= min(5, third/2)
		}
		return r.outcome(middleware.OutcomeStoreError) >= 5
	})
	time.Sleep(500 * time.Millisecond) // the outage lasts at least this long
	proxy.Restore()
	for _, ev := range evs[2*third:] {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	storeErrors := r.outcome(middleware.OutcomeStoreError)
	bypassed := r.outcome(middleware.OutcomeBypassed)
	r.note("cut after %d effects, held %s, store_error=%d, bypassed=%d", cutAt, held.Round(100*time.Millisecond), storeErrors, bypassed)
	if failOpen {
		if !shared {
			AssertAtLeast(t, "bypasses counted during the outage (fail-open)", bypassed, 1)
		}
		return
	}
	if bypassed != 0 {
		t.Errorf("fail-closed bypassed the store %d times", bypassed)
	}
	if !shared {
		AssertAtLeast(t, "store errors during the outage (fail-closed)", storeErrors, 1)
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

// ---- 7

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

func scenarioBadInput(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, BadInput, "")
	in := r.topic("in")
	poisonTopic := r.topic("poison")
	dlq := r.topic("dlq")
	n := events(2, 20)
	good := r.newEvents(n, "e")
	bad := r.newEvents(max(4, n/10), "b")

	var mu sync.Mutex
	var poisoned []*message.Message
	r.subscribe(poisonTopic, r.group("poison"), func(m *message.Message) {
		mu.Lock()
		poisoned = append(poisoned, m)
		mu.Unlock()
	})
	// The dead-letter replayer: what lands on dlq goes back to the input.
	r.subscribe(dlq, r.group("dlq"), func(m *message.Message) {
		again := message.NewMessage(m.UUID, m.Payload)
		again.Metadata = m.Metadata
		r.publishAsync(in, again)
	})
	spec := r.spec("c1", in)
	spec.Key = keyIDAndEvent
	spec.PoisonTopic = poisonTopic
	r.startConsumer(spec)

	badPayload := func(i int, ev event) *message.Message {
		if i%2 == 0 {
			return ev.messageWith([]byte(`{"amount":1}`)) // no event_id
		}
		return ev.messageWith([]byte("not json: " + ev.ID))
	}
	every := max(1, len(good)/len(bad))
	bi := 0
	for i, ev := range good {
		r.publish(in, ev.message())
		if i%every == every/2 && bi < len(bad) {
			r.publish(in, badPayload(bi, bad[bi]))
			bi++
		}
	}
	for ; bi < len(bad); bi++ {
		r.publish(in, badPayload(bi, bad[bi]))
	}
	r.waitSettled(n, r.allApplied(ids(good)))
	r.eventually("every bad message on the poison queue", timeout(len(bad)), func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(poisoned) >= len(bad), fmt.Sprintf("%d of %d poisoned", len(poisoned), len(bad))
	})
	AssertExactlyOnce(t, r.effects(), ids(good)) // the stream went on; nothing bad applied

	mu.Lock()
	got := append([]*message.Message(nil), poisoned...)
	mu.Unlock()
	badIDs := map[string]bool{}
	for _, ev := range bad {
		badIDs[ev.UUID] = true
	}
	for _, p := range got {
		if !badIDs[p.UUID] {
			t.Errorf("poisoned %s, which is not a bad message", p.UUID)
		}
		if reason := p.Metadata.Get(wmw.ReasonForPoisonedKey); !strings.Contains(reason, keyfuncs.ErrNoKey.Error()) {
			t.Errorf("poisoned %s with reason %q, want one naming %q", p.UUID, reason, keyfuncs.ErrNoKey)
		}
	}
	if len(got) != len(bad) {
		t.Errorf("%d messages poisoned, want %d", len(got), len(bad))
	}

	// Replay the poisoned messages, fixed, under their ids.
	for _, p := range got {
		ev := p.Metadata.Get(MetadataEvent)
		fixed := message.NewMessage(p.UUID, fmt.Appendf(nil, `{"%s":%q,"amount":1,"fixed":true}`, eventField, ev))
		for k, v := range p.Metadata {
			switch k {
			case wmw.ReasonForPoisonedKey, wmw.PoisonedTopicKey, wmw.PoisonedHandlerKey, wmw.PoisonedSubscriberKey:
			default:
				fixed.Metadata.Set(k, v)
			}
		}
		r.publish(in, fixed)
	}
	// Replay already processed messages through the dead-letter topic.
	replayed := good[:max(2, n/10)]
	for _, ev := range replayed {
		r.publishRaw(dlq, ev.message())
	}
	all := append(ids(good), ids(bad)...)
	r.eventually("the dead-letter replays handled", timeout(len(replayed)), func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		done := 0
		for _, ev := range replayed {
			if r.handledOK[ev.UUID] >= 2 {
				done++
			}
		}
		return done == len(replayed), fmt.Sprintf("%d of %d replays handled", done, len(replayed))
	})
	r.waitSettled(n, r.allApplied(all))
	AssertExactlyOnce(t, r.effects(), all)
	dups := r.outcome(middleware.OutcomeDuplicate)
	AssertAtLeast(t, "replayed duplicates dropped", dups, len(replayed))
	r.note("poisoned=%d fixed+replayed=%d dead-letter replays=%d no_key=%d", len(got), len(got), len(replayed), r.outcome(middleware.OutcomeNoKey))
}

// ---- 8

func scenarioOutputs(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, Outputs, "")
	in := r.topic("in")
	out := r.topic("out")
	n := events(2, 20)
	evs := r.newEvents(n, "e")
	down := r.spec("down", out)
	down.Handler = "downstream"
	down.Group = r.group("down")
	down.Downstream = true
	r.startConsumer(down) // first: its queue must exist before outputs flow
	up := r.spec("up", in)
	up.Handler = "upstream"
	up.Key = keyIDAndEvent
	up.OutTopic = out
	up.FlakyPublish = true
	r.startConsumer(up)
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	outs := make([]string, len(evs))
	for i, ev := range evs {
		outs[i] = "out:" + ev.ID
	}
	r.waitSettled(n, r.allApplied(append(ids(evs), outs...)))
	AssertExactlyOnce(t, r.effects(), append(ids(evs), outs...))
	r.mu.Lock()
	seen := r.uuidsSeen["down"]
	reemitted := r.scopeDups["upstream"]
	var unstable []string
	for _, ev := range evs {
		if k := len(seen[ev.ID]); k != 1 {
			unstable = append(unstable, fmt.Sprintf("%s: %d output ids", ev.ID, k))
		}
	}
	r.mu.Unlock()
	if len(unstable) > 0 {
		t.Errorf("outputs without one stable UUID: %s", first(unstable))
	}
	AssertAtLeast(t, "redeliveries after a failed publish that re-emitted stored outputs", reemitted, 1)
	r.note("outputs re-emitted=%d, downstream duplicates dropped=%d", reemitted, r.scopeDupsOf("downstream"))
}

func (r *run) scopeDupsOf(scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.scopeDups[scope]
}

// ---- 9

func scenarioRetention(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, Retention, "")
	in := r.topic("in")
	const retention = 3 * time.Second
	n := events(4, 20)
	evs := r.newEvents(n, "e")
	now := time.Now()
	for i := range evs {
		evs[i].At = now
	}
	spec := r.spec("c1", in)
	spec.Retention = retention
	spec.PublishedAt = true
	r.startConsumer(spec)
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	allDone := time.Now()
	// Inside the window: the last completed fifth again, a duplicate.
	order := r.effects()
	k := max(2, n/5)
	byID := map[string]event{}
	for _, ev := range evs {
		byID[ev.ID] = ev
	}
	var early []event
	for _, id := range order[len(order)-k:] {
		early = append(early, byID[id])
	}
	for _, ev := range early {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, nil)
	dupsInWindow := r.outcome(middleware.OutcomeDuplicate)
	AssertAtLeast(t, "redeliveries inside the window dropped as duplicates", dupsInWindow, len(early))
	// After the window: the first fifth again, with their original
	// publish time. Every record completed before allDone, so all have
	// expired once retention has passed since.
	late := evs[:k]
	if wait := time.Until(allDone.Add(retention + 500*time.Millisecond)); wait > 0 {
		time.Sleep(wait) // waiting for the window to pass is the scenario
	}
	for _, ev := range late {
		r.publish(in, ev.message())
	}
	want := map[string]int{}
	for _, ev := range evs {
		want[ev.ID] = 1
	}
	for _, ev := range late {
		want[ev.ID] = 2
	}
	r.waitSettled(n, func() (bool, string) {
		counts := countEffects(r.effectsQuiet())
		for _, ev := range late {
			if counts[ev.ID] < 2 {
				return false, fmt.Sprintf("late redelivery of %s not processed yet", ev.ID)
			}
		}
		return true, ""
	})
	AssertEffects(t, r.effects(), want)
	misses := r.outcome(middleware.OutcomeTTLMiss)
	AssertAtLeast(t, "ttl misses counted", misses, len(late))
	r.note("window=%s in-window duplicates=%d late redeliveries=%d processed again (expected), ttl_miss=%d", retention, len(early), len(late), misses)
}
