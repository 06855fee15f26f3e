package acceptance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
)

// The lifecycle scenarios: a router closed under running handlers, a
// subscriber's own deadline passing under one, a consumer group's
// rebalance under one, and a store slower than StoreTimeout. They hold
// handlers mid-effect with a holder and release them on what the probe
// or the broker reports, never after a fixed time.

// holdStage is where the first attempt of a held event waits, and what
// it does once it may go on.
type holdStage struct {
	// afterEffect: hold after writing the effect; otherwise before it.
	afterEffect bool
	// watchCtx: when the handler's context ends while it holds, return
	// ctx.Err() (a handler that stops on shutdown). Otherwise finish the
	// effect once released, whatever became of the context (a handler that
	// completes what it started); the effect is then written with the
	// context's values but not its cancellation.
	watchCtx bool
}

func (s holdStage) String() string {
	where, then := "before_effect", "finish"
	if s.afterEffect {
		where = "after_effect"
	}
	if s.watchCtx {
		then = "ctx_err"
	}
	return where + "/" + then
}

// What became of a held run.
const (
	heldFinished = "finished" // released, it applied its effect and returned nil
	heldCtxErr   = "ctx_err"  // its context ended while it held: it returned ctx.Err()
	heldFailed   = "failed"   // writing its effect failed
	heldEnded    = "ended"    // the scenario ended first
)

// heldRun is one held handler.
type heldRun struct {
	d       *delivery
	stage   holdStage
	release chan struct{}
	let     func() // closes release, once

	mu       sync.Mutex
	holding  bool      // waiting in the hold now
	outcome  string    // set when the handler returned
	returned time.Time // when it returned
}

func (hr *heldRun) released() bool {
	select {
	case <-hr.release:
		return true
	default:
		return false
	}
}

func (hr *heldRun) state() (holding bool, outcome string) {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return hr.holding, hr.outcome
}

func (hr *heldRun) end(outcome string, err error) error {
	hr.mu.Lock()
	hr.holding, hr.outcome, hr.returned = false, outcome, time.Now()
	hr.mu.Unlock()
	return err
}

// returnedAt is when the handler returned, or the zero time.
func (hr *heldRun) returnedAt() time.Time {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return hr.returned
}

func (hr *heldRun) run(ctx context.Context, apply func(context.Context) error, done <-chan struct{}) error {
	if hr.stage.afterEffect {
		if err := apply(ctx); err != nil {
			return hr.end(heldFailed, err)
		}
	}
	hr.mu.Lock()
	hr.holding = true
	hr.mu.Unlock()
	var ctxDone <-chan struct{}
	if hr.stage.watchCtx {
		ctxDone = ctx.Done()
	}
	select {
	case <-hr.release:
	case <-ctxDone:
		return hr.end(heldCtxErr, ctx.Err())
	case <-done:
		return hr.end(heldEnded, errCrashed)
	}
	if hr.stage.watchCtx && ctx.Err() != nil {
		return hr.end(heldCtxErr, ctx.Err())
	}
	if !hr.stage.afterEffect {
		if err := apply(context.WithoutCancel(ctx)); err != nil {
			return hr.end(heldFailed, err)
		}
	}
	return hr.end(heldFinished, nil)
}

// errHoldLater is the error of a planned event that reached a consumer
// after its holds were released: nacked, for the next consumer to hold.
var errHoldLater = errors.New("acceptance: a held event reached a consumer after its holds were released (nacked, for the next consumer to hold)")

// holder is a handlerHook that holds the first attempt of each planned
// event in its handler, until the scenario lets it go on.
type holder struct {
	r *run
	// nackWhenOff: a planned event arriving while holding is off is
	// nacked, and keeps its plan (graceful shutdown: the consumer is
	// closing); otherwise it runs as usual.
	nackWhenOff bool

	mu   sync.Mutex
	plan map[string]holdStage
	on   bool
	// only, when set, is the consumer whose deliveries hold; a planned
	// event reaching another one (one closed already, which took it while
	// it closed) is handled as while holding is off.
	only string
	runs []*heldRun
}

var _ handlerHook = (*holder)(nil)

func newHolder(r *run, nackWhenOff bool) *holder {
	return &holder{r: r, nackWhenOff: nackWhenOff, plan: map[string]holdStage{}}
}

func (h *holder) handle(ctx context.Context, d *delivery, apply func(context.Context) error) (bool, error) {
	h.mu.Lock()
	stage, planned := h.plan[d.event]
	on := h.on && (h.only == "" || h.only == d.consumer)
	switch {
	case !planned:
		h.mu.Unlock()
		return false, nil
	case !on && h.nackWhenOff:
		h.mu.Unlock()
		return true, errHoldLater
	case !on:
		h.mu.Unlock()
		return false, nil
	}
	delete(h.plan, d.event)
	release := make(chan struct{})
	hr := &heldRun{d: d, stage: stage, release: release, let: sync.OnceFunc(func() { close(release) })}
	h.runs = append(h.runs, hr)
	h.mu.Unlock()
	return true, hr.run(ctx, apply, h.r.done)
}

// hold turns holding on, for the deliveries of consumer only when it is
// not "".
func (h *holder) hold(consumer string) {
	h.mu.Lock()
	h.on, h.only = true, consumer
	h.mu.Unlock()
}

// releaseAll turns holding off and lets the held handlers that finish
// their effect go on. Those that watch their context are not let go:
// they return ctx.Err() when it ends, as a router that closes ends its
// subscriptions' contexts and the pub/subs their messages' with them;
// releaseAll waits for them to do so (once the others returned).
func (h *holder) releaseAll() {
	h.r.t.Helper()
	h.mu.Lock()
	h.on = false
	runs := append([]*heldRun(nil), h.runs...)
	h.mu.Unlock()
	watching := 0
	for _, hr := range runs {
		if hr.stage.watchCtx {
			watching++
			continue
		}
		hr.let()
	}
	if watching == 0 {
		return
	}
	h.r.eventually("the held handlers to return, those watching their context once it ended", timeout(len(runs)), func() (bool, string) {
		var running []string
		for _, hr := range runs {
			if _, outcome := hr.state(); outcome == "" {
				running = append(running, hr.d.event+" "+hr.stage.String())
			}
		}
		return len(running) == 0, fmt.Sprintf("still running: %s (a context that did not end when the router closed?)", strings.Join(running, ", "))
	})
}

// remaining is the number of planned events not held yet.
func (h *holder) remaining() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.plan)
}

func (h *holder) all() []*heldRun {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*heldRun(nil), h.runs...)
}

// holdingNow is the number of handlers holding now.
func (h *holder) holdingNow() int {
	n := 0
	for _, hr := range h.all() {
		if holding, _ := hr.state(); holding {
			n++
		}
	}
	return n
}

// awaitHeld waits until want handlers hold.
func (h *holder) awaitHeld(what string, want int) {
	h.r.t.Helper()
	h.r.eventually(what, timeout(want), func() (bool, string) {
		held := h.holdingNow()
		return held >= want, fmt.Sprintf("%d handlers held, want %d", held, want)
	})
}

// states lists every held run: its delivery, stage, whether it holds
// and its outcome, for a failure's log.
func (h *holder) states() string {
	var parts []string
	for _, hr := range h.all() {
		holding, outcome := hr.state()
		parts = append(parts, fmt.Sprintf("%s %s %s holding=%t released=%t outcome=%q", hr.d.key(), hr.d.event, hr.stage, holding, hr.released(), outcome))
	}
	return strings.Join(parts, "; ")
}

// describe summarises the held runs: "after_effect/finish:finished".
func (h *holder) describe() string {
	var parts []string
	for _, hr := range h.all() {
		_, outcome := hr.state()
		parts = append(parts, hr.stage.String()+":"+outcome)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// concurrency is how many handlers a single consumer of b on s runs at
// once, at least: every message on a backend without consumer groups
// (gochannel hands each to the router at once), one per shard on a
// sharded one (Kafka partitions), one otherwise (a queue's consumer, a
// watermill-sql group, JetStream pulling one message at a time); one in
// the transaction of a store that runs one at a time.
func concurrency(b Backend, s Store, planned int) int {
	switch {
	case s.Transactional && s.SingleWriter:
		return 1
	case !b.Features.ConsumerGroups:
		return planned
	case b.Features.shards() > 1:
		return b.Features.shards()
	}
	return 1
}

// redeliverUnacked publishes again every message of evs not handled yet:
// a backend that keeps nothing for a closed subscriber (gochannel) drops
// what it had not acked, where a persistent broker redelivers it to the
// group's next consumer. The copies are not counted as published: they
// are that redelivery.
func (r *run) redeliverUnacked(topic string, evs []event) int {
	r.t.Helper()
	var again []event
	r.mu.Lock()
	for _, ev := range evs {
		if r.handledOK[ev.UUID] < r.published[ev.UUID]*r.fanout {
			again = append(again, ev)
		}
	}
	r.mu.Unlock()
	for _, ev := range again {
		r.publishRaw(topic, ev.message())
	}
	return len(again)
}

// inflightAt is the number of deliveries of consumer in flight.
func (r *run) inflightAt(consumer string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k := range r.inflight {
		if strings.HasPrefix(k, consumer+"/") {
			n++
		}
	}
	return n
}

// checkFinishedRecorded checks that every held run that finished recorded
// its event done: a Complete (or commit) of its delivery succeeded. In
// lease mode that Complete ran after the handler, whatever became of the
// message's context; under AsyncComplete it ran in the background, and
// the scenario has closed the middlewares. The exception is a store that
// joins the subscriber's transaction: the subscriber may have rolled it
// back under the handler (its deadline passed while the handler was
// held), and the commit of the savepoint fails; nothing of the run stays,
// and the redelivery runs it (the effects say whether it did). It returns
// how many finished, and how many of those a rollback undid.
func (r *run) checkFinishedRecorded(h *holder) (finished, undone int) {
	r.t.Helper()
	for _, hr := range h.all() {
		if _, outcome := hr.state(); outcome != heldFinished {
			continue
		}
		finished++
		hr.d.proc.mu.Lock()
		completed, err := hr.d.completed, hr.d.completeErr
		hr.d.proc.mu.Unlock()
		switch {
		case completed:
		case r.s.JoinsSubscriberTx:
			undone++
		default:
			r.t.Errorf("held event %s (%s) finished its effect, but its delivery %s never recorded it done (last Complete/commit error: %v)", hr.d.event, hr.stage, hr.d.key(), err)
		}
	}
	return finished, undone
}

// scenarioGraceful is GracefulShutdown.
func scenarioGraceful(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, GracefulShutdown, "")
	in := r.topic("in")
	stages := []holdStage{{watchCtx: true}, {}, {afterEffect: true}}
	if s.Transactional {
		// Returning an error after the effect is a handler's bug in lease
		// mode (the effect stays, the claim is released); in a transaction
		// the rollback takes it away.
		stages = append(stages, holdStage{afterEffect: true, watchCtx: true})
	}
	n := events(25, 2*len(stages))
	evs := r.newEvents(n, "e")
	h := newHolder(r, true)
	for i, st := range stages {
		// evs[i] is on shard i: every held handler holds a partition of
		// its own on Kafka.
		h.plan[evs[i].ID] = st
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("held runs: %s", h.states())
		}
	})
	spec := r.spec("c", in)
	// The default lease (minutes): a claim a closing router cuts in
	// flight is given back by the middleware as soon as the store answers
	// it, so no key waits for a lease to run out, and no takeover
	// happens (the heartbeat keeps the held runs' leases).
	var rounds []string
	late := 0
	for round := 1; ; round++ {
		sp := spec
		sp.Name = fmt.Sprintf("c%d", round)
		// Decided before the consumer starts: its handlers may hold every
		// planned event before it is asked.
		remaining := h.remaining()
		if remaining > 0 {
			h.hold(sp.Name)
		}
		c := r.startConsumerWith(sp, conn{benv: r.benv, opened: r.opened, hook: h, watchClose: true})
		if round == 1 {
			for _, ev := range evs {
				r.publish(in, ev.message())
			}
		} else if !b.Features.Persistent {
			if k := r.redeliverUnacked(in, evs); k > 0 {
				r.note("round %d: %d messages the closed subscriber left unacked published again (gochannel keeps nothing for it)", round, k)
			}
		}
		if remaining == 0 {
			break // this consumer resumes the subscription to the end
		}
		want := min(remaining, concurrency(b, s, remaining))
		h.awaitHeld(fmt.Sprintf("round %d: %d handlers held", round, want), want)
		held := h.holdingNow()
		if err := c.shutdown(h.releaseAll); err != nil {
			t.Errorf("round %d: router.Close: %v", round, err)
		}
		if k := r.inflightAt(sp.Name); k > 0 {
			// Watermill's router.Close returns once the handlers it
			// counted returned; a message its subscriber handed over while
			// it closed may still run. Let it end before the next round.
			late++
			r.eventually(fmt.Sprintf("round %d: the deliveries %s took while closing to end", round, sp.Name), timeout(k), func() (bool, string) {
				k := r.inflightAt(sp.Name)
				return k == 0, fmt.Sprintf("%d deliveries still in its handlers", k)
			})
		}
		rounds = append(rounds, fmt.Sprint(held))
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	if s.AsyncComplete {
		r.stopConsumers()
	}
	AssertExactlyOnce(t, r.effects(), ids(evs))
	ctxErrs := 0
	for _, hr := range h.all() {
		switch _, outcome := hr.state(); outcome {
		case heldCtxErr:
			ctxErrs++
		case heldFinished:
		case heldFailed:
			// A transaction the closing pub/sub ended under the handler:
			// nothing of it stays, and the redelivery runs it.
		default:
			t.Errorf("held event %s (%s): %s", hr.d.event, hr.stage, outcome)
		}
	}
	finished, undone := r.checkFinishedRecorded(h)
	if undone > 0 {
		r.note("finished runs whose savepoint the subscriber's rollback undid (its deadline passed while they were held)=%d", undone)
	}
	r.mu.Lock()
	incomplete := r.ackedIncomplete
	r.mu.Unlock()
	if incomplete > 0 {
		t.Errorf("%d deliveries acked with their Complete not landed: a graceful Close must record every run that finished", incomplete)
	}
	if n := r.outcome(dedup.OutcomeTakeover); n > 0 {
		t.Errorf("%d takeovers: a key waited for its lease to run out (a claim cut by the closing router was not given back)", n)
	}
	if late > 0 {
		r.note("router.Close returned before a delivery taken while closing had ended (%d times)", late)
	}
	r.note("shutdowns=%d (handlers held at each Close: %s), held: %s; returned ctx.Err()=%d, finished=%d (recorded done), duplicates after the resume=%d",
		len(rounds), strings.Join(rounds, ","), h.describe(), ctxErrs, finished, r.outcome(dedup.OutcomeDuplicate))
}

// deadlineLease is the lease of the subscriber-deadline scenario: a
// heartbeat (Lease/3) extends it more than once while a handler outlives
// the deadline, and a loaded machine would have to stall an Extend for
// two thirds of it to lose it.
const deadlineLease = 6 * time.Second

// scenarioDeadline is SubscriberDeadline.
func scenarioDeadline(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, SubscriberDeadline, "")
	d := b.Deadline
	benv, name := r.benv, d.Name
	var expire func()
	if d.Prepare != nil {
		var err error
		if benv, name, expire, err = d.Prepare(t, r.benv); err != nil {
			t.Fatalf("backend %s: preparing its deadline: %v", b.Name, err)
		}
	}
	r.note("deadline: %s", name)
	in := r.topic("in")
	n := events(25, 6)
	evs := r.newEvents(n, "e")
	// One handler held after its effect, one before it; neither watches
	// its context (the subscriber may end it when it gives the delivery
	// up): each finishes once the second delivery of its message reached
	// the store.
	heldEvs := []event{evs[1], evs[n-2]}
	h := newHolder(r, false)
	h.plan[heldEvs[0].ID] = holdStage{afterEffect: true}
	h.plan[heldEvs[1].ID] = holdStage{}
	h.hold("")
	spec := r.spec("c", in)
	spec.Lease = deadlineLease
	// One consumer more than held handlers: the second delivery needs one
	// that is not holding (a queue's consumer, a Redis Streams member,
	// takes one delivery at a time: the requeued message, the claimed
	// entry, goes to another one). An ordered backend with a single shard
	// (watermill-sql) delivers one message at a time to its whole group,
	// and gives the expired delivery up itself: the same consumer takes
	// the redelivery while its router still runs the held handler.
	k := len(heldEvs) + 1
	if b.Features.Ordered && b.Features.shards() == 1 {
		k = 1
	}
	for i := 1; i <= k; i++ {
		sp := spec
		sp.Name = fmt.Sprintf("c%d", i)
		r.startConsumerWith(sp, conn{benv: benv, opened: r.opened, hook: h})
	}
	warm := r.warmUp(in, spec.Name, k)
	for _, ev := range evs {
		r.publish(in, ev.message())
	}
	expired := map[*heldRun]bool{}
	r.eventually("each held handler to outlive the deadline and its message to be delivered again", timeout(n), func() (bool, string) {
		runs := h.all()
		released := 0
		for _, hr := range runs {
			if hr.released() {
				released++
				continue
			}
			if holding, _ := hr.state(); !holding {
				continue
			}
			if expire != nil && !expired[hr] {
				expired[hr] = true
				expire()
			}
			if r.deliveredAgain(hr) {
				hr.let()
				released++
			}
		}
		return len(runs) == len(heldEvs) && released == len(runs),
			fmt.Sprintf("%d of %d handlers held, %d released", len(runs), len(heldEvs), released)
	})
	evs = append(warm, evs...)
	r.waitSettled(len(evs), r.allApplied(ids(evs)))
	if s.AsyncComplete {
		r.stopConsumers()
	}
	effects := r.effects()
	counts := countEffects(effects)
	calls := r.calls()
	want := map[string]int{}
	for _, ev := range evs {
		want[ev.ID] = 1
	}
	var notes []string
	for _, hr := range h.all() {
		ev := hr.d.event
		if _, outcome := hr.state(); outcome != heldFinished && outcome != heldFailed {
			t.Errorf("held event %s: %s", ev, outcome)
		}
		returned := hr.returnedAt()
		inProgress, waited, dups, extends := 0, 0, 0, 0
		var takeover *storeCall
		for i, c := range calls {
			switch {
			case c.event != ev:
			case c.delivery == hr.d.key():
				if c.op == opExtend && !c.err {
					extends++
				}
			case c.err || (c.op != opClaim && c.op != opBegin):
			case c.result == stores.Duplicate:
				dups++
			case c.sent.After(returned):
			case c.result == stores.InProgress:
				inProgress++
			case c.claimed() && c.takeover:
				takeover = &calls[i]
			case c.claimed() && s.Transactional:
				waited++ // joined: the deadline rolled the held transaction back
			}
		}
		switch {
		case s.Transactional:
			// The second delivery reached the store while the first held
			// (it released it), waiting on the record's lock, or, joined to
			// a subscriber transaction the deadline rolled back, finding
			// no record.
			_, outcome := hr.state()
			switch {
			case !s.JoinsSubscriberTx:
				if dups == 0 {
					t.Errorf("held event %s: no delivery of it ended as a duplicate after the held transaction committed", ev)
				}
				notes = append(notes, fmt.Sprintf("%s %s: the second delivery waited on the record, duplicates=%d", ev, hr.stage, dups))
			case waited == 0 && dups == 0:
				t.Errorf("held event %s: no other delivery claimed it or found it done", ev)
			default:
				notes = append(notes, fmt.Sprintf("%s %s: %s, claimed by a redelivery while held=%d, duplicates=%d", ev, hr.stage, outcome, waited, dups))
			}
		case takeover != nil:
			// The documented bound: the lease ran out (the heartbeat
			// stalled longer than two thirds of it), and another delivery
			// took the message over, which may run the effect again.
			_, i, ok := callOf(calls, hr.d.key())
			if ok && surelyWithin(lastLease(calls, i), *takeover, spec.Lease) {
				t.Errorf("held event %s: taken over by %s within %s of its last lease, which had not run out", ev, takeover.delivery, spec.Lease)
			}
			want[ev] = counts[ev] // at most 2, checked below
			if counts[ev] > 2 {
				t.Errorf("held event %s: %d effects after one takeover, want at most 2", ev, counts[ev])
			}
			notes = append(notes, fmt.Sprintf("%s %s: lease ran out, taken over (effects=%d)", ev, hr.stage, counts[ev]))
		default:
			if inProgress == 0 {
				t.Errorf("held event %s: no other delivery found it in progress while its handler outlived the deadline", ev)
			}
			if dups == 0 {
				t.Errorf("held event %s: no delivery of it ended as a duplicate once its handler finished", ev)
			}
			notes = append(notes, fmt.Sprintf("%s %s: in_progress=%d then duplicates=%d, heartbeats=%d", ev, hr.stage, inProgress, dups, extends))
		}
	}
	AssertEffects(t, effects, want)
	sort.Strings(notes)
	r.note("%s", strings.Join(notes, "; "))
}

// deliveredAgain reports whether another delivery of hr's event reached
// the store while hr holds: in lease mode a claim of it returned (it found
// the keys in progress, or took them over); in transactional mode one
// entered Begin (it waits on the record's lock, or, joined to a
// subscriber transaction the deadline rolled back, claims the keys).
func (r *run) deliveredAgain(hr *heldRun) bool {
	if r.s.Transactional {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.enteredN[hr.d.event] >= 2
	}
	for _, c := range r.calls() {
		if c.event == hr.d.event && c.delivery != hr.d.key() && c.op == opClaim && !c.err {
			return true
		}
	}
	return false
}

// scenarioRebalance is ConsumerRebalance.
func scenarioRebalance(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, ConsumerRebalance, "")
	in := r.topic("in")
	shards := b.Features.shards()
	first := r.newEvents(shards, "a") // one per shard, each held
	h := newHolder(r, false)
	for i, ev := range first {
		h.plan[ev.ID] = holdStage{afterEffect: i%2 == 0}
	}
	h.hold("")
	spec := r.spec("c", in)
	sp := spec
	sp.Name = "c1"
	r.startConsumerWith(sp, conn{benv: r.benv, opened: r.opened, hook: h})
	for _, ev := range first {
		r.publish(in, ev.message())
	}
	// A handler holding a single-writer store's transaction holds the
	// other shards' deliveries in Begin.
	h.awaitHeld("a handler of every shard held", concurrency(b, s, shards))
	held := h.holdingNow()
	sp.Name = "c2"
	r.startConsumerWith(sp, conn{benv: r.benv, opened: r.opened, hook: h})
	var states []string
	group := func(what string, cond func(GroupState) bool) {
		var last time.Time
		var st GroupState
		r.eventually(what, timeout(shards), func() (bool, string) {
			if time.Since(last) >= 100*time.Millisecond { // an admin request a poll is plenty
				last = time.Now()
				got, err := b.GroupState(t, r.benv, spec.Group)
				if err != nil {
					return false, err.Error()
				}
				st = got
			}
			return cond(st), fmt.Sprintf("group state %+v", st)
		})
		states = append(states, fmt.Sprintf("%d members rebalancing=%t", st.Members, st.Rebalancing))
	}
	// The second member joined: the group rebalances while the first
	// member's handlers hold every shard.
	group("the group to rebalance", func(st GroupState) bool { return st.Rebalancing || st.Members >= 2 })
	h.releaseAll()
	group("the rebalance to end with two members", func(st GroupState) bool { return !st.Rebalancing && st.Members == 2 })
	// The shards are shared now: the joining member gets messages.
	second := r.newEvents(2*shards, "b")
	for _, ev := range second {
		r.publish(in, ev.message())
	}
	all := append(first, second...)
	r.waitSettled(len(all), r.allApplied(ids(all)))
	if s.AsyncComplete {
		r.stopConsumers()
	}
	AssertExactlyOnce(t, r.effects(), ids(all))
	finished, _ := r.checkFinishedRecorded(h)
	r.mu.Lock()
	byC2 := r.handledBy["c2"]
	moved := 0
	for _, ev := range first {
		if len(r.uuidsSeen["c2"][ev.ID]) > 0 {
			moved++
		}
	}
	r.mu.Unlock()
	if byC2 == 0 {
		t.Errorf("the joining member handled nothing: no shard moved to it")
	}
	r.note("handlers held when the second member joined=%d (%s), finished=%d (recorded done); group: %s; messages handled by the joining member=%d, held messages it got again (offset not committed)=%d, duplicates=%d",
		held, h.describe(), finished, strings.Join(states, " -> "), byC2, moved, r.outcome(dedup.OutcomeDuplicate))
}

// The slow store: every byte to and from the store is late by
// slowLatency, longer than the consumer's StoreTimeout, so each call
// times out at the client while the store still acts on it (a claim, an
// Extend or a Complete whose reply came too late is on the record). The
// lease outlives the slowness.
const (
	slowLatency      = 1500 * time.Millisecond
	slowStoreTimeout = time.Second
	slowLease        = 6 * time.Second
)

// scenarioSlowStore is SlowStore, fail-closed or fail-open.
func scenarioSlowStore(t *testing.T, b Backend, s Store, failOpen bool) {
	variant := "fail_closed"
	if failOpen {
		variant = "fail_open"
	}
	r := newRun(t, b, s, SlowStore, variant)
	addr := r.senv[EnvAddr]
	if addr == "" {
		r.notApplicable(noSlowNetworkReason)
		return
	}
	proxy := testkit.NewProxy(t, addr)
	senv := r.senv.Clone()
	senv[EnvAddr] = proxy.Addr()
	cn := conn{benv: r.benv, opened: r.open(senv)}
	if s.JoinsSubscriberTx {
		// The store's calls run in the subscriber's transaction, on the
		// subscriber's connection: slow the database for both.
		if r.benv[EnvAddr] != addr {
			t.Fatalf("store %s joins the subscriber's transaction, but backend %s is not on its database (%s)", s.Name, b.Name, addr)
		}
		cn.benv = r.benv.Clone()
		cn.benv[EnvAddr] = proxy.Addr()
		r.note("joined: the store runs in the subscriber's transaction, both slow")
	}
	in := r.topic("in")
	n := events(20, 12)
	evs := r.newEvents(n, "e")
	third := n / 3
	spec := r.spec("c1", in)
	spec.Lease = slowLease
	spec.StoreTimeout = slowStoreTimeout
	spec.FailOpen = failOpen
	spec.RetryDelay = 20 * time.Millisecond
	// Fail-closed: the last event of the first third holds after its
	// effect until the store is slow, so that its Complete (or commit)
	// meets the slowness.
	h := newHolder(r, false)
	heldEv := evs[third-1]
	if !failOpen {
		h.plan[heldEv.ID] = holdStage{afterEffect: true}
		h.hold("")
		cn.hook = h
	}
	r.startConsumerWith(spec, cn)
	for _, ev := range evs[:third] {
		r.publish(in, ev.message())
	}
	before := ids(evs[:third])
	r.eventually("the first third handled", timeout(third), func() (bool, string) {
		counts := countEffects(r.effectsQuiet())
		missing := 0
		for _, ev := range before {
			// (The held event's effect may be in its open transaction.)
			if counts[ev] == 0 && (failOpen || ev != heldEv.ID) {
				missing++
			}
		}
		if failOpen {
			if ok, why := r.settled(); !ok {
				return false, why
			}
			return missing == 0, fmt.Sprintf("%d events without an effect", missing)
		}
		held := h.holdingNow()
		return held == 1 && missing == 0, fmt.Sprintf("%d held, %d other events without an effect", held, missing)
	})
	proxy.SetLatency(slowLatency)
	h.releaseAll()
	for _, ev := range evs[third : 2*third] {
		r.publish(in, ev.message())
	}
	// Slow until the middleware felt it: the held run's Complete or commit
	// failed (fail-closed), or runs bypassed the store (fail-open).
	r.eventually("the slow store felt", timeout(third), func() (bool, string) {
		if failOpen {
			n := r.outcome(dedup.OutcomeBypassed)
			return n >= 2, fmt.Sprintf("%d bypassed", n)
		}
		n := r.failedCompletes(heldEv.ID)
		return n >= 1, fmt.Sprintf("%d failed Complete/commit calls of the held event %s", n, heldEv.ID)
	})
	failedDuring := r.failedCallCount()
	proxy.SetLatency(0)
	for _, ev := range evs[2*third:] {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	if s.AsyncComplete {
		r.stopConsumers()
	}
	effects := r.effects()
	counts := countEffects(effects)
	calls := r.calls()
	bypassed := r.outcome(dedup.OutcomeBypassed)
	r.mu.Lock()
	incompleteBy := maps.Clone(r.incompleteBy)
	applied := make([]string, 0, len(r.effectBy))
	for key := range r.effectBy {
		applied = append(applied, key)
	}
	r.mu.Unlock()
	// A bypassed run: a delivery that applied its effect without a claim
	// (its claim failed: the probe traced it).
	claimedBy, eventOf := map[string]bool{}, map[string]string{}
	for _, c := range calls {
		eventOf[c.delivery] = c.event
		if c.claimed() {
			claimedBy[c.delivery] = true
		}
	}
	bypassRuns, bypassRunsBy := 0, map[string]int{}
	for _, key := range applied {
		if !claimedBy[key] {
			bypassRuns++
			bypassRunsBy[eventOf[key]]++
		}
	}
	want := map[string]int{}
	doubled, justified := 0, 0
	var bad []string
	for _, ev := range ids(evs) {
		want[ev] = 1
		g := counts[ev]
		if g <= 1 {
			continue
		}
		doubled++
		// The documented exposures: under fail-open each run that bypassed
		// the store (it left no record: another delivery runs again), and
		// in either mode a Complete that gave up after CompleteTimeout (the
		// message was acked with its record processing).
		if allowed := 1 + bypassRunsBy[ev] + incompleteBy[ev]; g <= allowed {
			justified++
			want[ev] = g
		} else {
			bad = append(bad, fmt.Sprintf("%s: %d effects, %d bypassed runs, %d Completes given up", ev, g, bypassRunsBy[ev], incompleteBy[ev]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("slow store: %d events applied more often than the documented bound allows: %s", len(bad), strings.Join(bad, "; "))
	}
	AssertEffects(t, effects, want)
	if failOpen {
		AssertAtLeast(t, "bypasses counted while the store was slow (fail-open)", bypassed, 1)
		if bypassRuns != bypassed {
			t.Errorf("%d runs applied their effect without a claim, but %d bypasses were counted (dedup.OutcomeBypassed)", bypassRuns, bypassed)
		}
	} else {
		if bypassed != 0 {
			t.Errorf("fail-closed bypassed the store %d times", bypassed)
		}
		if doubled > 0 && len(incompleteBy) == 0 {
			t.Errorf("fail-closed: %d events doubled", doubled)
		}
	}
	heldNote := ""
	if !failOpen {
		heldNote = fmt.Sprintf(", held %s run's Complete/commit failed %d times through it", heldEv.ID, r.failedCompletes(heldEv.ID))
	}
	r.note("slow: %s a byte each way (StoreTimeout %s), store calls timed out while slow=%d%s, bypassed=%d, store_error=%d, doubled=%d (each within the bound: bypassed runs, Completes given up)",
		slowLatency, slowStoreTimeout, failedDuring, heldNote, bypassed, r.outcome(dedup.OutcomeStoreError), justified)
}

// failedCompletes is the number of Complete and commit calls of event
// that failed.
func (r *run) failedCompletes(event string) int {
	n := 0
	for _, c := range r.calls() {
		if c.event == event && c.err && (c.op == opComplete || c.op == opCommit) {
			n++
		}
	}
	return n
}

// failedCallCount is the number of store calls that failed so far.
func (r *run) failedCallCount() int {
	n := 0
	for _, c := range r.calls() {
		if c.err {
			n++
		}
	}
	return n
}
