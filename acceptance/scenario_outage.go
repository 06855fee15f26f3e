package acceptance

import (
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/testkit"
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
