package sqltest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Mixed is a set of calls of every kind and outcome, prepared one at a
// time, then made at once so that they run in one batch: the group
// commit's tests, on every SQL store.
type Mixed struct {
	s     *sqlstore.Store
	clock *storetest.FakeClock
	// Scope is the scope of every call.
	Scope string
	data  []byte

	doneKey, busyKey, expiredKey, twinKey string
	newKeys                               []string
	complete, stale, release, extend      *stores.Claim
}

// PrepareMixed writes the records the calls of a Mixed need on s.
func PrepareMixed(t *testing.T, s *sqlstore.Store, clock *storetest.FakeClock) *Mixed {
	ctx := context.Background()
	m := &Mixed{s: s, clock: clock, Scope: "mixed-" + storetest.NewID()}
	m.data = make([]byte, 256)
	for i := range m.data {
		m.data[i] = byte(i)
	}
	claim := func(key string, lease time.Duration) *stores.Claim {
		t.Helper()
		c, err := s.Claim(ctx, m.Scope, []string{key}, lease)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("prepare Claim(%s): %+v %v", key, c, err)
		}
		return c
	}
	m.doneKey, m.busyKey, m.expiredKey, m.twinKey = "done", "busy", "expired", "twin"
	if err := s.Complete(ctx, claim(m.doneKey, time.Minute), time.Hour, m.data); err != nil {
		t.Fatal(err)
	}
	claim(m.expiredKey, time.Second)
	clock.Advance(2 * time.Second)
	claim(m.busyKey, time.Hour)
	m.complete = claim("complete", time.Minute)
	m.stale = claim("stale", time.Minute)
	if err := s.Complete(ctx, m.stale, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	m.release = claim("release", time.Minute)
	m.extend = claim("extend", 10*time.Second)
	m.newKeys = []string{"new1", "new2", "new3"}
	return m
}

// Run makes every call of m at once, calls before with their number
// while they run (to hold their batch until they have all queued), and
// checks each result.
func (m *Mixed) Run(t *testing.T, before func(calls int)) {
	ctx := context.Background()
	type res struct {
		c   *stores.Claim
		err error
	}
	claimKeys := append([]string{m.doneKey, m.busyKey, m.expiredKey, m.twinKey, m.twinKey}, m.newKeys...)
	claimRes := make([]res, len(claimKeys))
	var completeErr, staleErr, releaseErr, extendErr error
	var wg sync.WaitGroup
	for i, k := range claimKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := m.s.Claim(ctx, m.Scope, []string{k}, time.Minute)
			claimRes[i] = res{c, err}
		}()
	}
	for _, f := range []func(){
		func() { completeErr = m.s.Complete(ctx, m.complete, time.Hour, m.data) },
		func() { staleErr = m.s.Complete(ctx, m.stale, time.Hour, nil) },
		func() { releaseErr = m.s.Release(ctx, m.release) },
		func() { extendErr = m.s.Extend(ctx, m.extend, time.Hour) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	before(len(claimKeys) + 4)
	wg.Wait()

	for i, r := range claimRes {
		if r.err != nil {
			t.Fatalf("Claim(%s): %v", claimKeys[i], r.err)
		}
	}
	if c := claimRes[0].c; c.Result != stores.Duplicate || !bytes.Equal(c.Data, m.data) {
		t.Errorf("claim of a done key: %+v, want Duplicate with its data", c)
	}
	if c := claimRes[1].c; c.Result != stores.InProgress {
		t.Errorf("claim of a processing key: %+v, want InProgress", c)
	}
	if c := claimRes[2].c; c.Result != stores.Claimed || !c.Takeover {
		t.Errorf("claim of an expired processing key: %+v, want a takeover", c)
	}
	twins := []stores.Result{claimRes[3].c.Result, claimRes[4].c.Result}
	if !(twins[0] == stores.Claimed && twins[1] == stores.InProgress || twins[0] == stores.InProgress && twins[1] == stores.Claimed) {
		t.Errorf("two claims of one new key: %v, want one Claimed and one InProgress", twins)
	}
	for i := 5; i < len(claimRes); i++ {
		if c := claimRes[i].c; c.Result != stores.Claimed || c.Takeover {
			t.Errorf("claim of new key %s: %+v", claimKeys[i], c)
		}
	}
	if completeErr != nil {
		t.Errorf("Complete: %v", completeErr)
	}
	if !errors.Is(staleErr, stores.ErrLostClaim) {
		t.Errorf("Complete of a completed claim: %v, want ErrLostClaim", staleErr)
	}
	if releaseErr != nil {
		t.Errorf("Release: %v", releaseErr)
	}
	if extendErr != nil {
		t.Errorf("Extend: %v", extendErr)
	}

	// The records say the same.
	check := func(key string, want stores.Result) *stores.Claim {
		t.Helper()
		c, err := m.s.Claim(ctx, m.Scope, []string{key}, time.Minute)
		if err != nil || c.Result != want {
			t.Errorf("afterwards, Claim(%s) = %+v %v, want %s", key, c, err, want)
		}
		return c
	}
	if c := check("complete", stores.Duplicate); c != nil && !bytes.Equal(c.Data, m.data) {
		t.Errorf("completed in a batch: data %x, want %x", c.Data, m.data)
	}
	check("release", stores.Claimed)
	m.clock.Advance(30 * time.Second) // past the original 10s lease
	check("extend", stores.InProgress)
	check(m.newKeys[0], stores.InProgress)
	check(m.expiredKey, stores.InProgress) // taken over in the batch: held again
}
