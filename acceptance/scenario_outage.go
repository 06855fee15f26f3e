package acceptance

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// scenarioOutage is StoreOutage, fail-closed or fail-open.
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
	proxy := testkit.NewProxy(t, addr)
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
	// that cannot consume without the database either). Under fail-open a
	// sequential consumer (one RabbitMQ delivery at a time) first spends up
	// to CompleteTimeout (the lease) retrying the Complete the cut caught,
	// before its next Claim can fail and bypass: wait past that.
	hold := 3 * time.Second
	if failOpen {
		hold = 2*spec.Lease + time.Second
	}
	held := r.waitUntil(hold, func() bool {
		if failOpen {
			return r.outcome(dedup.OutcomeBypassed) >= min(5, third/2)
		}
		return r.outcome(dedup.OutcomeStoreError) >= 5
	})
	time.Sleep(500 * time.Millisecond) // the outage lasts at least this long
	proxy.Restore()
	for _, ev := range evs[2*third:] {
		r.publish(in, ev.message())
	}
	r.waitSettled(n, r.allApplied(ids(evs)))
	if doubled := assertOutageEffects(t, r.effects(), ids(evs), r.calls(), failOpen); doubled > 0 {
		r.note("%d events applied more than once, each after failed store calls (the documented outage exposure)", doubled)
	}
	storeErrors := r.outcome(dedup.OutcomeStoreError)
	bypassed := r.outcome(dedup.OutcomeBypassed)
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

// assertOutageEffects checks the effects of an outage run against the
// store calls the probe traced: every event applied at least once,
// nothing else applied, and an event applied more than once only as often
// as its failed store calls allow, the exposures the guarantee table
// names: a Complete or Extend that failed through an outage longer than
// the lease (or than CompleteTimeout after the handler) leaves the record
// processing, to be taken over after the lease by another delivery of the
// message — the broker's redelivery of a message whose ack the outage
// also caught, when the backend shares the store's server; and under
// fail-open (bypass) a failed claim may have run the handler unprotected,
// which leaves no record, so another delivery runs again. Under
// fail-closed a failed claim runs nothing. An event none of whose store
// calls failed is applied exactly once. It returns how many events were
// applied more than once.
func assertOutageEffects(t testing.TB, effects, events []string, calls []storeCall, bypass bool) int {
	t.Helper()
	failed := map[string]int{}
	for _, c := range calls {
		if c.err && ((bypass && c.op == opClaim) || c.op == opComplete || c.op == opExtend) {
			failed[c.event]++
		}
	}
	got := countEffects(effects)
	want := make(map[string]bool, len(events))
	var bad []string
	doubled := 0
	for _, ev := range events {
		want[ev] = true
		switch g := got[ev]; {
		case g == 0:
			bad = append(bad, fmt.Sprintf("%s: lost (no effect)", ev))
		case g > 1+failed[ev]:
			bad = append(bad, fmt.Sprintf("%s: %d effects after %d failed store calls (at most %d)", ev, g, failed[ev], 1+failed[ev]))
		case g > 1:
			doubled++
		}
	}
	for ev, g := range got {
		if !want[ev] {
			bad = append(bad, fmt.Sprintf("%s: unexpected (%d effects)", ev, g))
		}
	}
	if len(bad) > 0 {
		t.Errorf("outage effects: %d events wrong: %s", len(bad), strings.Join(bad, "; "))
	}
	return doubled
}
