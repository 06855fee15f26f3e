package acceptance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/stores"
)

// run is one scenario's state in the test process.
type run struct {
	t       *testing.T
	b       Backend
	s       Store
	sc      Scenario
	variant string
	id      string
	start   time.Time
	logger  watermill.LoggerAdapter

	benv, senv Env
	opened     Opened
	mem        *ledger.Mem // nil when the store keeps the ledger
	pub        message.Publisher
	pubMu      sync.Mutex // see publishOne

	done     chan struct{} // closed when the scenario ends
	doneOnce sync.Once

	crashes chan crashNote
	hangs   chan string

	mu              sync.Mutex
	events          int
	fanout          int
	outcomes        map[dedup.Outcome]int
	deliveries      int
	published       map[string]int    // copies per message UUID on the input topic
	eventOf         map[string]string // message UUID -> event, for reports
	due             int               // handles due: copies published x fanout
	handledDue      int               // successful handles that were due
	handledOK       map[string]int    // successful deliveries per message UUID
	handledBy       map[string]int    // successful deliveries per consumer
	inflight        map[string]string // delivery key -> event, of the deliveries in flight
	enteredN        map[string]int    // store Claims/Begins per event
	completeOK      map[string]int
	completeLost    map[string]int
	crashPlan       map[string]bool                       // events whose crash is still to happen
	hangPlan        map[string]bool                       // events whose hang is still to happen
	hungBy          map[string]string                     // event -> the delivery that hung
	scopeDups       map[string]int                        // duplicates dropped per scope
	uuidsSeen       map[string]map[string]map[string]bool // consumer -> event -> message uuids
	crashLog        []crashRecord
	callLog         []storeCall     // store calls of every delivery, see storeCall
	effectBy        map[string]bool // deliveries that applied a memory-ledger effect
	notes           []string
	na              string // why the scenario does not apply, found at run time
	effectCount     int
	completeErr     int                // Complete/commit calls that failed (not a lost claim)
	ackedIncomplete int                // deliveries acked although their Complete failed
	incompleteBy    map[string]int     // the same per event (in-process consumers)
	groups          map[[2]string]bool // (topic, group) pairs consumers used
	stoppers        []func()           // stop every consumer started, idempotent
}

type crashNote struct {
	consumer string
	delivery string // the key of the delivery that crashed
	event    string
	point    crashPoint
	// kill kills the consumer and returns the deliveries it caught
	// between their effect and their Complete.
	kill func() int
}

type crashRecord struct {
	consumer string
	delivery string
	event    string
	point    crashPoint
	window   int
}

func newID() string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "a" + hex.EncodeToString(b[:])
}

// newRun sets the backend and the store up for one scenario.
func newRun(t *testing.T, b Backend, s Store, sc Scenario, variant string) *run {
	t.Helper()
	r := &run{
		t: t, b: b, s: s, sc: sc, variant: variant,
		id:           newID(),
		start:        time.Now(),
		logger:       logger(),
		done:         make(chan struct{}),
		crashes:      make(chan crashNote, 64),
		hangs:        make(chan string, 64),
		fanout:       1,
		outcomes:     map[dedup.Outcome]int{},
		published:    map[string]int{},
		eventOf:      map[string]string{},
		handledOK:    map[string]int{},
		handledBy:    map[string]int{},
		inflight:     map[string]string{},
		enteredN:     map[string]int{},
		completeOK:   map[string]int{},
		completeLost: map[string]int{},
		crashPlan:    map[string]bool{},
		hangPlan:     map[string]bool{},
		hungBy:       map[string]string{},
		effectBy:     map[string]bool{},
		scopeDups:    map[string]int{},
		uuidsSeen:    map[string]map[string]map[string]bool{},
		incompleteBy: map[string]int{},
	}
	// Registered first, so it runs last: the row sees every failure.
	t.Cleanup(r.record)
	t.Cleanup(r.finish)
	t.Cleanup(r.removeGroups) // after every consumer stopped
	var err error
	if b.Setup != nil {
		if r.benv, err = b.Setup(t); err != nil {
			t.Fatalf("backend %s setup: %v", b.Name, err)
		}
	}
	if r.benv == nil {
		r.benv = Env{}
	}
	if s.Setup != nil {
		if r.senv, err = s.Setup(t, r.id); err != nil {
			t.Fatalf("store %s setup: %v", s.Name, err)
		}
	}
	if r.senv == nil {
		r.senv = Env{}
	}
	r.opened = r.open(r.senv)
	if r.opened.Ledger == nil {
		r.mem = ledger.NewMem()
	}
	// Count the effects while the store is still open; the cleanups of
	// consumers and topics, registered later, run before this one.
	t.Cleanup(r.countEffects)
	pub, err := b.NewPublisher(t, r.benv)
	if err != nil {
		t.Fatalf("backend %s publisher: %v", b.Name, err)
	}
	r.pub = pub
	t.Cleanup(func() {
		if err := pub.Close(); err != nil {
			t.Logf("closing the publisher: %v", err)
		}
	})
	return r
}

// open opens the store described by env and checks it fits its mode.
func (r *run) open(env Env) Opened {
	r.t.Helper()
	o, err := r.s.Open(r.t, env)
	if err != nil {
		r.t.Fatalf("store %s open: %v", r.s.Name, err)
	}
	if o.Store == nil {
		r.t.Fatalf("store %s: Open returned no Store", r.s.Name)
	}
	if r.s.Transactional && o.Ledger == nil {
		r.t.Fatalf("store %s is Transactional but Open returned no Ledger", r.s.Name)
	}
	r.t.Cleanup(func() {
		if err := o.Store.Close(context.Background()); err != nil {
			r.t.Logf("closing the store: %v", err)
		}
	})
	return o
}

// finish ends the scenario: dead and hung handlers may return.
func (r *run) finish() {
	r.doneOnce.Do(func() { close(r.done) })
}

func (r *run) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// topic creates a topic unique to the run.
func (r *run) topic(name string) string {
	r.t.Helper()
	topic := r.id + "_" + name
	if r.b.CreateTopic != nil {
		if err := r.b.CreateTopic(r.t, r.benv, topic); err != nil {
			r.t.Fatalf("backend %s: create topic %s: %v", r.b.Name, topic, err)
		}
	}
	return topic
}

// group returns a consumer group name unique to the run.
func (r *run) group(name string) string { return r.id + "_" + name }

// used notes that a consumer of group reads topic, for RemoveGroup.
func (r *run) used(topic, group string) {
	r.mu.Lock()
	if r.groups == nil {
		r.groups = map[[2]string]bool{}
	}
	r.groups[[2]string{topic, group}] = true
	r.mu.Unlock()
}

func (r *run) removeGroups() {
	if r.b.RemoveGroup == nil {
		return
	}
	r.mu.Lock()
	pairs := make([][2]string, 0, len(r.groups))
	for p := range r.groups {
		pairs = append(pairs, p)
	}
	r.mu.Unlock()
	for _, p := range pairs {
		if err := r.b.RemoveGroup(r.t, r.benv, p[0], p[1]); err != nil {
			r.t.Logf("backend %s: remove group %s of %s: %v", r.b.Name, p[1], p[0], err)
		}
	}
}

// addStopper registers the stop function of a consumer for stopConsumers.
func (r *run) addStopper(stop func()) {
	r.mu.Lock()
	r.stoppers = append(r.stoppers, stop)
	r.mu.Unlock()
}

// stopConsumers stops every consumer of the run (ending the scenario, see
// finish) and, under AsyncComplete, closes their middlewares: every
// Complete in flight has then landed or given up, and the ones that gave
// up are counted as acked after a failed Complete. Scenarios call it
// before they check Complete outcomes of an AsyncComplete store; the
// cleanups stop the consumers of every other run.
func (r *run) stopConsumers() {
	r.mu.Lock()
	stoppers := append([]func(){}, r.stoppers...)
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, stop := range stoppers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop()
		}()
	}
	wg.Wait()
}

// ---- events and publishing

// event is one logical event of a scenario.
type event struct {
	ID    string
	UUID  string
	Shard int
	At    time.Time
}

func (r *run) newEvents(n int, prefix string) []event {
	evs := make([]event, n)
	shards := r.b.Features.shards()
	for i := range evs {
		evs[i] = event{
			ID:    fmt.Sprintf("%s%05d", prefix, i),
			UUID:  watermill.NewUUID(),
			Shard: i % shards,
		}
	}
	r.mu.Lock()
	r.events += n
	r.mu.Unlock()
	return evs
}

func ids(evs []event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// message builds the message of ev with a valid payload.
func (ev event) message() *message.Message {
	return ev.messageWith(fmt.Appendf(nil, `{"%s":%q,"amount":1}`, eventField, ev.ID))
}

func (ev event) messageWith(payload []byte) *message.Message {
	m := message.NewMessage(ev.UUID, payload)
	m.Metadata.Set(MetadataEvent, ev.ID)
	m.Metadata.Set(MetadataShard, strconv.Itoa(ev.Shard))
	at := ev.At
	if at.IsZero() {
		at = time.Now()
	}
	m.Metadata.Set(MetadataPublishedAt, at.UTC().Format(time.RFC3339Nano))
	return m
}

// publish publishes msgs to the input topic, counting the copies of each
// message id the consumers must handle.
func (r *run) publish(topic string, msgs ...*message.Message) {
	r.t.Helper()
	r.mu.Lock()
	for _, m := range msgs {
		r.published[m.UUID]++
		r.due += r.fanout
		r.eventOf[m.UUID] = m.Metadata.Get(MetadataEvent)
	}
	r.mu.Unlock()
	r.publishRaw(topic, msgs...)
}

// publishOne publishes msg, one publish at a time. Publishing from
// several goroutines at once is not what any scenario tests, and
// watermill-sql's MySQL adapter loses messages then: two inserts may
// commit out of their AUTO_INCREMENT order, and a consumer that acked the
// later offset never reads the earlier one.
func (r *run) publishOne(topic string, msg *message.Message) error {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	return r.pub.Publish(topic, msg)
}

// maxPending bounds what publishPaced lets wait for a consumer.
const maxPending = 64

// publishPaced publishes like publish, waiting while maxPending published
// copies are not handled yet: a producer not infinitely faster than its
// consumers. It keeps a backend that runs every delivery at once
// (gochannel) from burying the store under hundreds of concurrent calls,
// whose timeouts would turn into the duplicates of failed Completes and
// expired leases instead of the behaviour under test.
func (r *run) publishPaced(topic string, msgs ...*message.Message) {
	r.t.Helper()
	for _, m := range msgs {
		r.pace()
		r.publish(topic, m)
	}
}

// pace waits while maxPending published copies are not handled yet.
func (r *run) pace() {
	r.t.Helper()
	r.eventually("the consumers to keep up", timeout(maxPending), func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		pending := r.due - r.handledDue
		return pending < maxPending, fmt.Sprintf("%d published copies not handled", pending)
	})
}

// publishNative publishes m of event with the backend's native client
// np, paced like publishPaced, counting the copies of each producer id
// the consumers must handle (a Native consumer identifies a delivery by
// the producer's id).
func (r *run) publishNative(np NativePublisher, topic, event string, m NativeMessage) {
	r.t.Helper()
	r.pace()
	r.mu.Lock()
	r.published[m.ID]++
	r.due += r.fanout
	r.eventOf[m.ID] = event
	r.mu.Unlock()
	r.pubMu.Lock() // one publish at a time, see publishOne
	err := np.Publish(topic, m)
	r.pubMu.Unlock()
	if err != nil {
		r.t.Fatalf("publish %s (event %s) to %s with the native client: %v", m.ID, event, topic, err)
	}
}

// publishRaw publishes msgs without expecting them on the input topic.
func (r *run) publishRaw(topic string, msgs ...*message.Message) {
	r.t.Helper()
	for _, m := range msgs {
		if err := r.publishOne(topic, m); err != nil {
			r.t.Fatalf("publish %s to %s: %v", m.UUID, topic, err)
		}
	}
}

// ---- what consumers report (sink methods of run)

func (r *run) Observe(scope string, o dedup.Outcome) {
	r.mu.Lock()
	r.outcomes[o]++
	if o == dedup.OutcomeDuplicate {
		r.scopeDups[scope]++
	}
	r.mu.Unlock()
}

func (r *run) ObserveStore(string, string, time.Duration, error) {}

func (r *run) delivered(d *delivery) {
	r.mu.Lock()
	r.deliveries++
	r.inflight[d.key()] = d.event
	byEvent := r.uuidsSeen[d.consumer]
	if byEvent == nil {
		byEvent = map[string]map[string]bool{}
		r.uuidsSeen[d.consumer] = byEvent
	}
	if byEvent[d.event] == nil {
		byEvent[d.event] = map[string]bool{}
	}
	byEvent[d.event][d.uuid] = true
	r.mu.Unlock()
}

func (r *run) handled(d *delivery, err error) {
	r.mu.Lock()
	delete(r.inflight, d.key())
	if err == nil {
		if r.handledOK[d.uuid] < r.published[d.uuid]*r.fanout {
			r.handledDue++
		}
		r.handledOK[d.uuid]++
		r.handledBy[d.consumer]++
	}
	r.mu.Unlock()
}

// dropInflight forgets the deliveries of a killed child.
func (r *run) dropInflight(consumer string) {
	r.mu.Lock()
	for k := range r.inflight {
		if strings.HasPrefix(k, consumer+"/") {
			delete(r.inflight, k)
		}
	}
	r.mu.Unlock()
}

func (r *run) effect(d *delivery, event string) {
	r.mu.Lock()
	r.effectBy[d.key()] = true
	r.mu.Unlock()
	_ = r.mem.Record(context.Background(), ledger.Effect{Event: event})
}

func (r *run) entered(d *delivery) {
	r.mu.Lock()
	r.enteredN[d.event]++
	r.mu.Unlock()
}

func (r *run) completed(d *delivery, err error) {
	r.mu.Lock()
	switch {
	case err == nil:
		r.completeOK[d.event]++
	case errors.Is(err, stores.ErrLostClaim):
		r.completeLost[d.event]++
	default:
		r.completeErr++
	}
	r.mu.Unlock()
}

func (r *run) storeCalled(_ *delivery, c storeCall) { r.traced(c) }

func (r *run) incomplete(d *delivery) {
	r.mu.Lock()
	r.ackedIncomplete++
	if d != nil { // (a child's report names no delivery)
		r.incompleteBy[d.event]++
	}
	r.mu.Unlock()
}

func (r *run) claimCrash(event string) bool { return take(&r.mu, r.crashPlan, event) }
func (r *run) claimHang(event string) bool  { return take(&r.mu, r.hangPlan, event) }

func (r *run) logCrash(c crashRecord) {
	r.mu.Lock()
	r.crashLog = append(r.crashLog, c)
	r.mu.Unlock()
}

// maxHang bounds a hang whose release never comes.
const maxHang = 90 * time.Second

func (r *run) hang(d *delivery) bool {
	r.mu.Lock()
	r.hungBy[d.event] = d.key()
	r.mu.Unlock()
	select {
	case r.hangs <- d.event:
	default:
	}
	deadline := time.Now().Add(maxHang)
	for !r.hangReleased(d.event) {
		if time.Now().After(deadline) {
			r.t.Errorf("event %s: hung for %s and nobody took it over", d.event, maxHang)
			return true
		}
		select {
		case <-r.done:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// hangReleased: lease mode, another delivery applied the effect (it took
// the lease over); transactional mode, another delivery reached the store.
func (r *run) hangReleased(event string) bool {
	if r.s.Transactional {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.enteredN[event] >= 2
	}
	return r.mem.Count(event) >= 1
}

// ---- waiting and reading

// eventually polls cond until it holds; cond returns what is still
// missing. It judges by progress, not by the clock alone: it gives up
// when timeout passes without a single due message handled (the run is
// stuck), or after progressCap timeouts in all (a hang guard), so that a
// slow but moving run on a loaded machine is not failed.
func (r *run) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	r.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	last := r.progress()
	for {
		ok, missing := cond()
		if ok {
			return
		}
		now := time.Now()
		if p := r.progress(); p > last {
			last, deadline = p, now.Add(timeout)
		}
		if now.After(deadline) || now.Sub(start) > progressCap*timeout {
			r.note("timed out waiting for %s: %s", what, missing)
			r.t.Fatalf("timed out after %s (%s without progress) waiting for %s: %s",
				now.Sub(start).Round(time.Second), timeout, what, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// progressCap bounds a wait that keeps progressing, in timeouts.
const progressCap = 4

// progress counts the due messages handled so far.
func (r *run) progress() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.handledDue
}

// timeout scales a wait with the number of events.
func timeout(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*20*time.Millisecond
}

// settled reports whether every published copy was handled by every
// consumer it fans out to, and no live delivery is in flight.
func (r *run) settled() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pending []string
	for uuid, copies := range r.published {
		if got := r.handledOK[uuid]; got < copies*r.fanout {
			pending = append(pending, fmt.Sprintf("%s (event %s, %d of %d copies)", uuid, r.eventOf[uuid], got, copies*r.fanout))
		}
	}
	if len(pending) > 0 {
		return false, fmt.Sprintf("%d published messages not handled yet: %s; %d deliveries so far", len(pending), first(pending), r.deliveries)
	}
	if n := len(r.inflight); n > 0 {
		var which []string
		for key, event := range r.inflight {
			which = append(which, key+" (event "+event+")")
		}
		return false, fmt.Sprintf("%d deliveries still in flight: %s", n, first(which))
	}
	return true, ""
}

// lostAfter is how long extra may fail once every published message was
// handled and acked with nothing in flight, before the missing effects
// count as lost: nothing is left to bring them. It is long because a
// message can be late without being lost: watermill-sql's PostgreSQL
// subscriber reads no row newer than the oldest transaction open on the
// server, and the scenarios running beside this one hold transactions
// open for a while on purpose (a hung handler, a held one). A run that
// passes never waits for it.
const lostAfter = 2 * time.Minute

// waitSettled waits until settled and extra (if any) hold.
func (r *run) waitSettled(n int, extra func() (bool, string)) {
	r.t.Helper()
	var quietSince time.Time
	r.eventually("every message handled", timeout(n), func() (bool, string) {
		if ok, missing := r.settled(); !ok {
			quietSince = time.Time{}
			return false, missing
		}
		if extra == nil {
			return true, ""
		}
		ok, missing := extra()
		switch {
		case ok:
			return true, ""
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) > lostAfter:
			r.note("LOST: every message was acked, but %s", missing)
			r.t.Fatalf("every published message was handled and acked, nothing is in flight, and for %s: %s: lost", lostAfter, missing)
		}
		return false, missing
	})
}

// effects returns the recorded effects.
func (r *run) effects() []string {
	r.t.Helper()
	if r.mem != nil {
		e, _ := r.mem.Effects(context.Background())
		return ledger.EventsOf(e)
	}
	e, err := r.opened.Ledger.Effects(context.Background())
	if err != nil {
		r.t.Fatalf("reading the ledger: %v", err)
	}
	return ledger.EventsOf(e)
}

// allApplied is an extra condition for waitSettled: every event has an
// effect.
func (r *run) allApplied(events []string) func() (bool, string) {
	return func() (bool, string) {
		counts := countEffects(r.effectsQuiet())
		missing := 0
		example := ""
		for _, e := range events {
			if counts[e] == 0 {
				missing++
				if example == "" {
					example = e
				}
			}
		}
		if missing > 0 {
			return false, fmt.Sprintf("%d of %d events have no effect yet (e.g. %s)", missing, len(events), example)
		}
		return true, ""
	}
}

// effectsQuiet reads the ledger for a poll: an error counts as "not yet".
func (r *run) effectsQuiet() []string {
	if r.mem != nil {
		e, _ := r.mem.Effects(context.Background())
		return ledger.EventsOf(e)
	}
	e, _ := r.opened.Ledger.Effects(context.Background())
	return ledger.EventsOf(e)
}

func (r *run) outcome(o dedup.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcomes[o]
}

// ---- the summary row

// countEffects notes the number of effects for the summary.
func (r *run) countEffects() {
	n := 0
	if r.mem != nil {
		n = r.mem.Len()
	} else if t, err := r.opened.Ledger.Totals(context.Background()); err == nil {
		n = int(t.Effects)
	}
	r.mu.Lock()
	r.effectCount = n
	r.mu.Unlock()
}

func (r *run) record() {
	r.mu.Lock()
	row := Row{
		Broker:     r.b.Name,
		Store:      r.s.Name,
		Scenario:   r.sc.label(r.variant),
		Events:     r.events,
		Deliveries: r.deliveries,
		Duplicates: r.outcomes[dedup.OutcomeDuplicate],
		Duration:   time.Since(r.start),
	}
	notes := append([]string(nil), r.notes...)
	if r.completeErr > 0 {
		notes = append(notes, fmt.Sprintf("failed Completes/commits=%d", r.completeErr))
	}
	if r.ackedIncomplete > 0 {
		notes = append(notes, fmt.Sprintf("acked after a failed Complete=%d", r.ackedIncomplete))
	}
	if n := r.outcomes[dedup.OutcomeStoreError]; n > 0 && r.sc != StoreOutage {
		notes = append(notes, fmt.Sprintf("store_error=%d", n))
	}
	r.mu.Unlock()
	row.Effects = r.effectCount
	switch {
	case r.na != "" && !r.t.Failed():
		row.Result = ResultNotApplicable
		notes = []string{r.na}
	case r.t.Failed():
		row.Result = ResultFail
	case r.t.Skipped():
		row.Result = ResultSkip
	default:
		row.Result = ResultPass
	}
	sort.Strings(notes)
	row.Note = strings.Join(notes, "; ")
	recordRow(row)
}

// logger returns a Watermill logger: ACCEPTANCE_LOG=debug (or trace) logs
// to stderr, otherwise nothing is logged.
func logger() watermill.LoggerAdapter {
	switch os.Getenv("ACCEPTANCE_LOG") {
	case "debug":
		return watermill.NewStdLogger(true, false)
	case "trace":
		return watermill.NewStdLogger(true, true)
	case "info":
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}
