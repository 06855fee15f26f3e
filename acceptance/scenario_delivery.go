package acceptance

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	dedup "github.com/watermill-dedup/dedup"
)

// scenarioNack is NackRedelivery.
func scenarioNack(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, NackRedelivery, "")
	in := r.topic("in")
	n := events(1, 20)
	evs := r.newEvents(n, "e")
	spec := r.spec("c1", in)
	spec.FailFirst = true
	c := r.startConsumer(spec)
	for _, ev := range evs {
		r.publishPaced(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	effects := r.effects()
	AssertExactlyOnce(t, effects, ids(evs))
	failed := int(c.core.fails.Load())
	if failed != n {
		t.Errorf("%d first attempts failed, want one per event (%d)", failed, n)
	}
	r.note("failed first attempts=%d (panics %d), released=%d", failed, failed/5, r.outcome(dedup.OutcomeReleased))
	if b.Features.Ordered {
		shard := map[string]int{}
		for _, ev := range evs {
			shard[ev.ID] = ev.Shard
		}
		AssertFirstEffectsInOrder(t, effects, ids(evs), func(e string) int { return shard[e] })
		r.note("order checked")
	}
}

// scenarioConcurrent is ConcurrentDuplicates.
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
		r.publishPaced(in, ev.message())
		copies++
		if i%4 == 1 {
			r.publishPaced(in, ev.onShard(1).message())
			copies++
		}
	}
	evs = append(warm, evs...)
	r.waitSettled(len(evs), r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	r.mu.Lock()
	fanout := r.fanout
	r.mu.Unlock()
	AssertAtLeast(t, "duplicates dropped", r.outcome(dedup.OutcomeDuplicate), copies*fanout-len(evs))
	r.note("%d consumers, %d copies, in_progress=%d", k, copies, r.outcome(dedup.OutcomeInProgress))
}

// scenarioRepublish is ProducerRepublish.
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
		r.publishPaced(in, ev.message())
		if i%5 != 2 {
			continue
		}
		again := ev.onShard(1)
		again.UUID = watermill.NewUUID()
		republished++
		if i%2 == 0 {
			r.publishPaced(in, again.message())
		} else {
			later = append(later, again)
		}
	}
	for _, ev := range later {
		r.publishPaced(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	AssertExactlyOnce(t, r.effects(), ids(evs))
	AssertAtLeast(t, "duplicates dropped", r.outcome(dedup.OutcomeDuplicate), republished)
	r.note("republished=%d under new ids", republished)
}
