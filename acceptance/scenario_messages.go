package acceptance

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
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
	dups := r.outcome(middleware.OutcomeDuplicate)
	AssertAtLeast(t, "replayed duplicates dropped", dups, len(replayed))
	r.note("poisoned=%d fixed+replayed=%d dead-letter replays=%d no_key=%d", len(got), len(got), len(replayed), r.outcome(middleware.OutcomeNoKey))
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
	if s.AsyncComplete {
		// The retention window of a record starts when its Complete
		// lands, after the ack under AsyncComplete.
		r.eventually("every Complete landed", timeout(n), func() (bool, string) {
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
