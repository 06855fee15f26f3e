package acceptance

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
)

// foreignRetention is the consumer's retention in ForeignProducer: the
// event published before it is a ttl miss, every other one is fresh.
const foreignRetention = time.Hour

// scenarioForeign is ForeignProducer.
func scenarioForeign(t *testing.T, b Backend, s Store) {
	r := newRun(t, b, s, ForeignProducer, "")
	chk := newForeignCheck(*b.Native)
	native := chk.native()
	r.b.Native = &native // this run's consumers report to chk
	in := r.topic("in")
	np, err := native.NewPublisher(t, r.benv)
	if err != nil {
		t.Fatalf("backend %s: native publisher (%s): %v", b.Name, native.Client, err)
	}
	t.Cleanup(func() {
		if err := np.Close(); err != nil {
			t.Logf("closing the native publisher: %v", err)
		}
	})
	spec := r.spec("c1", in)
	spec.Native = true
	spec.Key = keyNativeAndEvent
	spec.FailFirst = true
	spec.Retention = foreignRetention
	c := r.startConsumer(spec)

	evs := r.newEvents(events(4, 20), "e")
	// A fourth of the events is published without a time of the
	// producer's (see NativeMessage.At).
	untimed := map[string]bool{}
	for i, ev := range evs {
		if i%4 == 2 {
			untimed[ev.ID] = true
		}
	}
	var old []string
	if native.PublishedAt != nil {
		// Published two retentions ago: each of its claims is a ttl miss.
		ev := r.newEvents(1, "old")[0]
		ev.At = time.Now().Add(-2 * foreignRetention)
		evs = append(evs, ev)
		old = append(old, ev.ID)
	}
	publish := func(ev event, id string) {
		at := ev.At
		if at.IsZero() {
			at = time.Now()
		}
		chk.published(id, at, untimed[ev.ID])
		m := NativeMessage{ID: id, Payload: nativePayload(id, ev.ID), At: at}
		if untimed[ev.ID] {
			m.At = time.Time{}
		}
		r.publishNative(np, in, ev.ID, m)
	}
	type republish struct {
		ev event
		id string
	}
	var later []republish
	sameID, newID := 0, 0
	for i, ev := range evs {
		publish(ev, ev.UUID) // the event's UUID is the producer's id
		var again republish
		switch i % 5 {
		case 1: // the producer sends the same message again
			again = republish{ev, ev.UUID}
			sameID++
		case 3: // the event again, as a new message
			again = republish{ev, watermill.NewUUID()}
			newID++
		default:
			continue
		}
		if i%10 < 5 {
			publish(again.ev, again.id)
		} else {
			later = append(later, again)
		}
	}
	for _, again := range later {
		publish(again.ev, again.id)
	}

	all := ids(evs)
	// A key function that fails a native message leaves it redelivered
	// for ever: stop at the first wrong key rather than at the timeout.
	r.eventually("every message handled (or a wrong key)", timeout(len(evs)), func() (bool, string) {
		if chk.failing() {
			return true, ""
		}
		return r.settled()
	})
	if chk.failing() {
		r.note("stopped at the first wrong key, copy key or publish time")
		for _, p := range chk.wrong() {
			t.Error(p)
		}
		t.FailNow()
	}
	applied := r.allApplied(all)
	r.waitSettled(len(evs), func() (bool, string) {
		if ok, missing := applied(); !ok {
			return false, missing
		}
		// A copy key is noted when the copy is keyed: wait until every
		// copy was (a redelivery may have been handled twice instead).
		return chk.everyCopyKeyed(r.publishedCopies())
	})
	AssertExactlyOnce(t, r.effects(), all)

	failed := int(c.core.fails.Load())
	if failed != len(evs) {
		t.Errorf("%d first attempts failed, want one per event (%d)", failed, len(evs))
	}
	AssertAtLeast(t, "republished copies dropped as duplicates", r.outcome(dedup.OutcomeDuplicate), sameID+newID)

	for _, p := range chk.problems(r.publishedCopies(), old, r.outcome(dedup.OutcomeTTLMiss)) {
		t.Error(p)
	}

	notes := []string{
		fmt.Sprintf("producer %s", native.Client),
		fmt.Sprintf("key %s+event_id", native.KeyName),
		fmt.Sprintf("republished %d under the same id, %d under a new id", sameID, newID),
		fmt.Sprintf("failed first attempts (redeliveries)=%d", failed),
		fmt.Sprintf("in_progress=%d", r.outcome(dedup.OutcomeInProgress)),
		fmt.Sprintf("the producer's id checked on %d deliveries", chk.keyedCount()),
	}
	if names := chk.otherKeyNames(); names != "" {
		notes = append(notes, "also by "+names)
	}
	if native.CopyKey != nil {
		notes = append(notes, fmt.Sprintf("copy key %s stable across redeliveries", native.CopyKeyName))
	}
	if native.PublishedAt != nil {
		readings, none := chk.readingCount()
		notes = append(notes, fmt.Sprintf("published-at read %d times, each as the producer set it (%d found none: sent without a time), ttl_miss=%d (the claims of the event published two retentions before)",
			readings, none, r.outcome(dedup.OutcomeTTLMiss)))
	} else {
		notes = append(notes, "published-at: none (no way to carry a publish time)")
	}
	r.note("%s", strings.Join(notes, ", "))
}

// publishedCopies returns the copies published per producer id (per
// message UUID for Watermill's publisher).
func (r *run) publishedCopies() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.published))
	for id, n := range r.published {
		out[id] = n
	}
	return out
}

// foreignCheck watches what a backend's native key functions and
// publish-time reader return for every delivery of ForeignProducer.
type foreignCheck struct {
	base Native

	mu        sync.Mutex
	ats       map[string][]time.Time     // producer id -> publish time of each copy
	untimed   map[string]bool            // producer ids published without a time
	keyed     int                        // deliveries keyed
	bad       []string                   // wrong keys, wrong copy keys, wrong publish times
	copyKeys  map[string]map[string]bool // producer id -> copy keys seen
	copyOwner map[string]string          // copy key -> producer id
	readings  int                        // PublishedAt calls
	none      int                        // PublishedAt calls that found no time
	staleOf   map[string]int             // event -> readings older than the retention
}

func newForeignCheck(base Native) *foreignCheck {
	return &foreignCheck{
		base:      base,
		ats:       map[string][]time.Time{},
		untimed:   map[string]bool{},
		copyKeys:  map[string]map[string]bool{},
		copyOwner: map[string]string{},
		staleOf:   map[string]int{},
	}
}

// native returns base with its Key and PublishedAt reporting to c.
func (c *foreignCheck) native() Native {
	n := c.base
	n.Key = c.key
	if n.PublishedAt != nil {
		n.PublishedAt = c.publishedAt
	}
	return n
}

// published notes a copy of producer id id, published at at, with that
// time unless untimed.
func (c *foreignCheck) published(id string, at time.Time, untimed bool) {
	c.mu.Lock()
	c.ats[id] = append(c.ats[id], at)
	if untimed {
		c.untimed[id] = true
	}
	c.mu.Unlock()
}

func (c *foreignCheck) problem(format string, args ...any) {
	c.mu.Lock()
	c.bad = append(c.bad, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// key is the consumer's Native.Key: base.Key, checked with the other
// keys and the copy key against the producer's id in the payload.
func (c *foreignCheck) key(msg *message.Message) ([]string, error) {
	id, event := nativeIdentity(msg.Payload)
	keys, err := c.base.Key(msg)
	c.checkKey(c.base.KeyName, id, event, keys, err)
	for name, k := range c.base.OtherKeys {
		ks, err := k(msg)
		c.checkKey(name, id, event, ks, err)
	}
	if c.base.CopyKey != nil {
		ks, err := c.base.CopyKey(msg)
		c.mu.Lock()
		switch {
		case err != nil || len(ks) != 1:
			c.bad = append(c.bad, fmt.Sprintf("copy key %s of %s (event %s): %q, %v; want one key", c.base.CopyKeyName, id, event, ks, err))
		case c.copyOwner[ks[0]] != "" && c.copyOwner[ks[0]] != id:
			c.bad = append(c.bad, fmt.Sprintf("copy key %s %q of %s (event %s) was the key of %s too", c.base.CopyKeyName, ks[0], id, event, c.copyOwner[ks[0]]))
		default:
			c.copyOwner[ks[0]] = id
			if c.copyKeys[id] == nil {
				c.copyKeys[id] = map[string]bool{}
			}
			c.copyKeys[id][ks[0]] = true
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.keyed++
	c.mu.Unlock()
	return keys, err
}

func (c *foreignCheck) checkKey(name, id, event string, keys []string, err error) {
	if err != nil || len(keys) != 1 || keys[0] != id {
		c.problem("key %s of the native message %s (event %s): %q, %v; want the producer's id", name, id, event, keys, err)
	}
}

// publishedAt is the consumer's Native.PublishedAt: base.PublishedAt,
// checked against the time the producer set (or, when it set none, the
// time it sent the message, if a time is found at all).
func (c *foreignCheck) publishedAt(msg *message.Message) (time.Time, bool) {
	at, ok := c.base.PublishedAt(msg)
	now := time.Now()
	id, event := nativeIdentity(msg.Payload)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readings++
	if !ok {
		c.none++
		if !c.untimed[id] {
			c.bad = append(c.bad, fmt.Sprintf("published-at of %s (event %s): no time, want the producer's", id, event))
		}
		return at, ok
	}
	match := false
	for _, want := range c.ats[id] {
		if d := at.Sub(want); d <= time.Second && d >= -time.Second {
			match = true
		}
	}
	if !match {
		wants := make([]string, len(c.ats[id]))
		for i, want := range c.ats[id] {
			wants[i] = want.UTC().Format(time.RFC3339Nano)
		}
		c.bad = append(c.bad, fmt.Sprintf("published-at of %s (event %s): %s, want the producer's (%s), to a second", id, event, at.UTC().Format(time.RFC3339Nano), strings.Join(wants, " or ")))
	}
	if now.Sub(at) > foreignRetention {
		c.staleOf[event]++
	}
	return at, ok
}

// everyCopyKeyed reports whether every published copy has its copy key.
func (c *foreignCheck) everyCopyKeyed(copies map[string]int) (bool, string) {
	if c.base.CopyKey == nil {
		return true, ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range copies {
		if got := len(c.copyKeys[id]); got < n {
			return false, fmt.Sprintf("%s: %d copy keys seen of %d copies published", id, got, n)
		}
	}
	return true, ""
}

// problems returns what went wrong: wrong keys or times, copy keys that
// are not one per published copy, ttl misses other than the claims of
// the old events (old lists them).
func (c *foreignCheck) problems(copies map[string]int, old []string, ttlMisses int) []string {
	out := c.wrong()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base.CopyKey != nil {
		for id, n := range copies {
			if got := len(c.copyKeys[id]); got != n {
				out = append(out, fmt.Sprintf("copy key %s: %d keys for the %d published copies of %s: a redelivery changed it", c.base.CopyKeyName, got, n, id))
			}
		}
	}
	if c.base.PublishedAt == nil {
		return out
	}
	isOld := map[string]bool{}
	for _, id := range old {
		isOld[id] = true
	}
	stale := 0
	for event, n := range c.staleOf {
		stale += n
		if !isOld[event] {
			out = append(out, fmt.Sprintf("published-at: event %s read as older than the retention (%s), but it was published just now", event, foreignRetention))
		}
	}
	for _, event := range old {
		if c.staleOf[event] == 0 {
			out = append(out, fmt.Sprintf("published-at: event %s, published %s before, was never read as older than the retention (%s)", event, 2*foreignRetention, foreignRetention))
		}
	}
	if ttlMisses != stale {
		out = append(out, fmt.Sprintf("ttl_miss=%d, want one per claim of a message older than the retention (%d)", ttlMisses, stale))
	}
	return out
}

// wrong returns the wrong keys, copy keys and publish times seen, at
// most maxReported of them.
func (c *foreignCheck) wrong() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]string(nil), c.bad...)
	if len(out) > maxReported {
		out = append(out[:maxReported], fmt.Sprintf("... and %d more", len(c.bad)-maxReported))
	}
	return out
}

// failing reports whether a key, copy key or publish time was wrong.
func (c *foreignCheck) failing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.bad) > 0
}

func (c *foreignCheck) keyedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keyed
}

// readingCount returns the PublishedAt calls, and those that found no
// time.
func (c *foreignCheck) readingCount() (readings, none int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readings, c.none
}

func (c *foreignCheck) otherKeyNames() string {
	names := make([]string, 0, len(c.base.OtherKeys))
	for name := range c.base.OtherKeys {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
