package acceptance

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

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

// scenarioCrash is ConsumerCrash.
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
	if s.AsyncComplete {
		r.note("async Complete: the window lasts until the Complete lands, after the ack")
	}
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
	if s.AsyncComplete {
		// Every Complete in flight lands (or gives up, and is counted as
		// acked after a failed Complete) before the bounds are checked.
		r.stopConsumers()
	}
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
	// the crashes that hit between effect and Complete. Under
	// AsyncComplete that window lasts until the Complete lands, after the
	// ack: a crash after Complete in this scenario (crashAfterComplete
	// wraps the middleware, which returns before its Complete lands) and
	// any crash while an acked delivery's Complete is in flight may add a
	// duplicate too, and each kill counts those deliveries (proc.kill; a
	// child's effects without a reported Complete) in its window.
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
	// A delivery acked after its Complete failed for good leaves its
	// record to run out like a crashed one's: it widens the window the
	// same way.
	r.mu.Lock()
	incomplete := r.ackedIncomplete
	r.mu.Unlock()
	AssertBetween(t, "duplicate effects (lease mode)", extra, planned, window+incomplete)
	// Each crash after effect left its claim processing: the claim that
	// replaced it came after its lease ran out and is a takeover, unless
	// it came so late that the store may have forgotten the expired claim.
	crashedBy := map[string]string{}
	var crashed []string
	for _, c := range log {
		if c.point == crashAfterEffect {
			crashedBy[c.event] = c.delivery
			crashed = append(crashed, c.event)
		}
	}
	calls := r.calls()
	takeovers, fresh, after := checkTakeovers(t, "crashed", calls, crashed, crashedBy, spec.Lease)
	// The middleware reports a takeover the store reports on a delivery's
	// claim before it runs the handler: every delivery that applied an
	// effect after a takeover claim reported it, and a SIGKILL may have cut
	// the report of one that had not applied its effect yet.
	r.mu.Lock()
	withEffect := 0
	for _, c := range calls {
		if c.claimed() && c.takeover && r.effectBy[c.delivery] {
			withEffect++
		}
	}
	r.mu.Unlock()
	reported := r.outcome(dedup.OutcomeTakeover)
	AssertBetween(t, "takeovers reported by the middleware", reported, withEffect, takeovers)
	r.note("takeovers=%d (crashed claims claimed again %s after their last lease) fresh claims after the store could forget=%d", reported, strings.Join(after, ","), fresh)
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
	r.logCrash(crashRecord{consumer: note.consumer, delivery: note.delivery, event: note.event, point: note.point, window: window})
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

// scenarioLease is LeaseExpiry.
func scenarioLease(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, LeaseExpiry, "")
	in := r.topic("in")
	n := events(5, 12)
	evs := r.newEvents(n, "e")
	// The copy that takes a hung event over goes to the last shard, where
	// nothing hangs. A consumer handles a shard in order (a Kafka
	// partition): a copy queued behind another hung event would reach the
	// store only once that one is released, possibly after the store
	// forgot the expired claim, and its claim would then be a fresh one,
	// not a takeover.
	spare := b.Features.shards() - 1
	hungAt := func(i int) event {
		if spare > 0 && evs[i].Shard == spare {
			i--
		}
		return evs[i]
	}
	hung := []event{hungAt(1), hungAt(n / 2), hungAt(n - 2)}
	spec := r.spec("c", in)
	// The heartbeat (Lease/3) keeps every other event's lease however
	// slow its store calls are on a loaded machine; a hung attempt's
	// heartbeats never reach the store (probeStore.Extend), as a stalled
	// process sends none, so only its lease runs out. (With no heartbeat
	// at all, any event whose claim-to-Complete outlasted the lease under
	// load was taken over by its redelivery and applied twice.)
	spec.Lease = 5 * time.Second
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
	// When an attempt hangs, publish its message again (same id) on the
	// spare shard, for another consumer to pick up.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case id := <-r.hangs:
				ev := byID[id]
				r.publishAsync(in, ev.onShard(spare-ev.Shard).message())
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
	if s.AsyncComplete {
		// The stalled runs are acked before their Completes are refused:
		// let every Complete in flight land before counting them.
		r.stopConsumers()
	}
	AssertExactlyOnce(t, r.effects(), ids(evs))
	calls := r.calls()
	r.mu.Lock()
	defer r.mu.Unlock()
	undone := 0
	for _, ev := range hung {
		got := r.completeOK[ev.ID]
		switch {
		case s.JoinsSubscriberTx && got >= 1:
			// A stalled run's savepoint released after the backend's
			// deadline is rolled back with the subscriber's transaction;
			// the exactly-once effect above is what stayed.
			undone += got - 1
		case got != 1:
			t.Errorf("hung event %s: %d successful Complete/commit, want exactly 1", ev.ID, got)
		}
		if r.enteredN[ev.ID] < 2 {
			t.Errorf("hung event %s: %d deliveries reached the store, want a second one while it hung", ev.ID, r.enteredN[ev.ID])
		}
		if !s.Transactional && r.completeLost[ev.ID] < 1 {
			t.Errorf("hung event %s: the stalled run's Complete was not refused (lost claim)", ev.ID)
		}
	}
	if s.Transactional {
		note := fmt.Sprintf("hung=%d, each overlapped by a waiting duplicate; one commit each", len(hung))
		if s.JoinsSubscriberTx {
			note = fmt.Sprintf("hung=%d, each overlapped by a waiting duplicate; one commit each kept, %d rolled back with the subscriber's transaction", len(hung), undone)
		}
		r.notes = append(r.notes, note)
		return
	}
	takeovers, fresh, after := checkTakeovers(t, "hung", calls, ids(hung), r.hungBy, spec.Lease)
	// The middleware reports every takeover the store reports, and no
	// other (every claim that starts a delivery goes through it).
	reported := r.outcomes[dedup.OutcomeTakeover]
	AssertBetween(t, "takeovers reported by the middleware", reported, takeovers, takeovers)
	refused := 0
	for _, n := range r.completeLost {
		refused += n
	}
	r.notes = append(r.notes, fmt.Sprintf("hung=%d takeovers=%d (hung claims claimed again %s after) fresh claims after the store could forget=%d stalled Completes refused=%d",
		len(hung), reported, strings.Join(after, ","), fresh, refused))
}

// checkTakeovers checks, for each event of events, the claim that
// replaced the claim of its stalled delivery (byDelivery: event -> the
// delivery, hung or crashed as what says), against the Store contract: it
// came after the stalled claim's lease ran out, and it reports
// Claim.Takeover unless the store may have forgotten the expired claim —
// a store keeps it for at least one more lease, and a claim later than
// that may be a fresh one. The lease runs from the claim or from the last
// Extend (heartbeat) that succeeded. It returns the takeovers the store
// reported on the claims that started a delivery (of every event), the
// replacements that came too late to be sure of a takeover, and how long
// after the stalled claim's last lease each replacement came.
func checkTakeovers(t *testing.T, what string, calls []storeCall, events []string, byDelivery map[string]string, lease time.Duration) (takeovers, fresh int, after []string) {
	t.Helper()
	for _, c := range calls {
		if c.claimed() && c.takeover {
			takeovers++
		}
	}
	for _, ev := range events {
		_, i, ok := callOf(calls, byDelivery[ev])
		if !ok {
			t.Errorf("%s event %s: no winning claim traced for the %s delivery %q", what, ev, what, byDelivery[ev])
			continue
		}
		rc, ok := replacement(calls, i)
		if !ok {
			t.Errorf("%s event %s: no other delivery claimed it after the %s claim", what, ev, what)
			continue
		}
		sc := lastLease(calls, i)
		since := rc.returned.Sub(sc.sent)
		after = append(after, "+"+since.Round(10*time.Millisecond).String())
		switch {
		case surelyWithin(sc, rc, lease):
			t.Errorf("%s event %s: claimed again by %s within %s of the %s claim's last lease (%s), before it ran out", what, ev, rc.delivery, since, what, sc.op)
		case rc.takeover:
		case surelyWithin(sc, rc, 2*lease):
			t.Errorf("%s event %s: claimed again by %s within %s of the %s claim's last lease (%s), less than two leases (%s), without Claim.Takeover: the store forgot an expired claim before it had been expired for one more lease",
				what, ev, rc.delivery, since, what, sc.op, 2*lease)
		default:
			fresh++
		}
	}
	return takeovers, fresh, after
}
