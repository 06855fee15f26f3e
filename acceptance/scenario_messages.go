package acceptance

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// scenarioBadInput is BadInput.
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
	dups := r.outcome(dedup.OutcomeDuplicate)
	AssertAtLeast(t, "replayed duplicates dropped", dups, len(replayed))
	r.note("poisoned=%d fixed+replayed=%d dead-letter replays=%d no_key=%d", len(got), len(got), len(replayed), r.outcome(dedup.OutcomeNoKey))
}

// scenarioOutputs is Outputs.
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

// scenarioRetention is Retention.
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
	r.waitCompleted(evs)
	allDone := time.Now()
	// Inside the window: the last completed fifth again, a duplicate.
	order := r.effects()
	k := max(2, n/5)
	byID := map[string]event{}
	for _, ev := range evs {
		byID[ev.ID] = ev
	}
	var early []event
	inEarly := map[string]bool{}
	for _, id := range order[len(order)-k:] {
		early = append(early, byID[id])
		inEarly[id] = true
	}
	for _, ev := range early {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, nil)
	// Whether a redelivery met a live record depends on when the store
	// saw it, which a stalled machine may delay past the window's end.
	// Until k redeliveries surely reached the store inside the window,
	// one more event is published and, once done, published again at
	// once.
	extra := 0
	deadline := time.Now().Add(timeout(n))
	for checkWindow(r.calls(), s.Transactional, retention).inside < k {
		if time.Now().After(deadline) {
			t.Fatalf("no %d redeliveries reached the store inside the retention window (%s) in %s", k, retention, timeout(n))
		}
		ev := r.newEvents(1, fmt.Sprintf("x%d_", extra))[0]
		extra++
		evs = append(evs, ev)
		r.publish(in, ev.message())
		r.waitSettled(1, r.allApplied([]string{ev.ID}))
		r.waitCompleted([]event{ev})
		r.publish(in, ev.message())
		r.waitSettled(1, nil)
	}
	// After the window: the first fifth not republished yet, again, with
	// their original publish time. Every record completed before allDone,
	// so all have expired once retention has passed since.
	var late []event
	for _, ev := range evs[:n] {
		if len(late) < k && !inEarly[ev.ID] {
			late = append(late, ev)
		}
	}
	if wait := time.Until(allDone.Add(retention + 500*time.Millisecond)); wait > 0 {
		time.Sleep(wait) // waiting for the window to pass is the scenario
	}
	for _, ev := range late {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, nil)
	w := checkWindow(r.calls(), s.Transactional, retention)
	for _, p := range w.problems {
		t.Error(p)
	}
	for _, u := range w.unsureAt {
		t.Logf("claim too close to the end of the retention window to tell: %s", u)
	}
	for _, ev := range late {
		if w.after[ev.ID] == 0 {
			t.Errorf("late redelivery of %s: the store did not surely see it after the retention window", ev.ID)
		}
	}
	want := map[string]int{}
	for _, ev := range evs {
		want[ev.ID] = 1 + w.rerun[ev.ID]
	}
	// (A handler's effect may be committed after it returned: with the
	// inbox in watermill-sql's transaction, when the subscriber commits.)
	r.waitSettled(n, func() (bool, string) {
		counts := countEffects(r.effectsQuiet())
		for _, ev := range evs {
			if counts[ev.ID] < want[ev.ID] {
				return false, fmt.Sprintf("%s has %d effects of %d", ev.ID, counts[ev.ID], want[ev.ID])
			}
		}
		return true, ""
	})
	AssertEffects(t, r.effects(), want)
	after := 0
	for _, n := range w.after {
		after += n
	}
	// Every run surely after the window is of a message published more
	// than a window earlier, hence a ttl miss (a first run may be one
	// too). A run too close to the window's end to tell is not counted:
	// the store's clock and the middleware's may put it on either side.
	misses := r.outcome(dedup.OutcomeTTLMiss)
	AssertAtLeast(t, "ttl misses counted", misses, after)
	// The middleware drops every Duplicate the store answers, and reports
	// it.
	AssertBetween(t, "duplicates reported by the middleware", r.outcome(dedup.OutcomeDuplicate), w.dups, w.dups)
	r.note("window=%s redeliveries: %d surely inside it (dropped), %d surely after it (processed again, ttl_miss=%d), %d too close to its end to tell; %d more events republished at once after a stall",
		retention, w.inside, after, misses, w.unsure, extra)
}

// waitCompleted waits, under AsyncComplete, until the Complete of every
// event of evs landed: a record's retention window starts when its
// Complete lands, after the ack. Without AsyncComplete it landed before
// the ack.
func (r *run) waitCompleted(evs []event) {
	r.t.Helper()
	if !r.s.AsyncComplete {
		return
	}
	r.eventually("every Complete landed", timeout(len(evs)), func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ev := range evs {
			if r.completeOK[ev.ID] == 0 {
				return false, fmt.Sprintf("no successful Complete of %s yet", ev.ID)
			}
		}
		return true, ""
	})
}

// window is what checkWindow found.
type window struct {
	inside   int            // claims the store surely saw inside a record's window
	after    map[string]int // claims it surely saw after a record's window, per event
	unsure   int            // claims too close to a window's end to tell
	unsureAt []string       // those claims, with the bounds of their interval
	rerun    map[string]int // claims of an event with a record that won it again, per event
	dups     int            // claims answered Duplicate
	problems []string       // breaches of the Store contract
}

// checkWindow checks every claim of an event that already has a done
// record against the Store contract: the record is done until retention
// after the store made it so (at the Complete; in transactional mode, at
// the Begin of the transaction that committed it), so a claim the store
// surely saw before then is a Duplicate, and one it surely saw after is
// Claimed and runs again. A claim too close to the end of the window to
// tell, given when the probe sent and got back both calls, may be either.
func checkWindow(calls []storeCall, tx bool, retention time.Duration) window {
	committed := map[string]bool{} // transactional: deliveries that committed
	for _, c := range calls {
		if c.op == opCommit && !c.err {
			committed[c.delivery] = true
		}
	}
	w := window{after: map[string]int{}, rerun: map[string]int{}}
	done := map[string]storeCall{} // event -> the call that made its record done
	for _, c := range calls {
		if !tx && c.op == opComplete && !c.err {
			done[c.event] = c
			continue
		}
		if (c.op != opClaim && c.op != opBegin) || c.err || c.again || c.result == stores.InProgress {
			continue
		}
		if c.result == stores.Duplicate {
			w.dups++
		}
		if d, ok := done[c.event]; ok {
			switch {
			case surelyWithin(d, c, retention):
				w.inside++
				if c.result != stores.Duplicate {
					w.problems = append(w.problems, fmt.Sprintf("event %s: claim of %s answered %s at most %s after its record was done (%s), inside the retention window (%s): want a duplicate",
						c.event, c.delivery, c.result, c.returned.Sub(d.sent), d.op, retention))
				}
			case surelyAfter(d, c, retention):
				w.after[c.event]++
				if c.result != stores.Claimed {
					w.problems = append(w.problems, fmt.Sprintf("event %s: claim of %s answered %s at least %s after its record was done (%s), past the retention window (%s): want it claimed and processed again",
						c.event, c.delivery, c.result, c.sent.Sub(d.returned), d.op, retention))
				}
			default:
				w.unsure++
				w.unsureAt = append(w.unsureAt, fmt.Sprintf("%s by %s (%s): %s to %s after its record was done (%s in %s)",
					c.event, c.delivery, c.result, c.sent.Sub(d.returned), c.returned.Sub(d.sent), d.op, d.returned.Sub(d.sent)))
			}
			if c.result == stores.Claimed {
				w.rerun[c.event]++
			}
		}
		if tx && c.result == stores.Claimed && committed[c.delivery] {
			done[c.event] = c
		}
	}
	return w
}
