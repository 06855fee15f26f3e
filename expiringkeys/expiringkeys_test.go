package expiringkeys_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func newMemstore(t *testing.T, clock stores.Clock) stores.Store { return testkit.Memstore(t, clock) }

func newRepo(t *testing.T, store stores.Store, cfg expiringkeys.Config) *expiringkeys.Repository {
	return testkit.MustNew(t, expiringkeys.New, store, cfg)
}

func mustSee(t *testing.T, r *expiringkeys.Repository, key string, want bool, why string) {
	t.Helper()
	testkit.MustSee(t, r, key, want, why)
}

func TestNewRefusesWhatTheStoreCannotHonour(t *testing.T) {
	bounded := &testkit.HookStore{Store: newMemstore(t, nil), OnCaps: func(c stores.Capabilities) stores.Capabilities {
		c.MaxLease, c.MaxRetention, c.MaxScope = time.Minute, time.Hour, 8
		return c
	}}
	cases := []struct {
		name  string
		store stores.Store
		cfg   expiringkeys.Config
		want  []string
	}{
		{"nil store", nil, expiringkeys.Config{Scope: "s"}, []string{"a store is required"}},
		{"no scope", bounded, expiringkeys.Config{}, []string{"Scope is required"}},
		{"negative window", bounded, expiringkeys.Config{Scope: "s", Window: -time.Second}, []string{"Window must not be negative, got -1s"}},
		{"negative lease", bounded, expiringkeys.Config{Scope: "s", Lease: -time.Second}, []string{"Lease must not be negative, got -1s"}},
		{"window", bounded, expiringkeys.Config{Scope: "s", Window: 2 * time.Hour},
			[]string{"Window: window 2h0m0s is longer than memstore's MaxRetention (1h0m0s)", "lower it"}},
		{"lease", bounded, expiringkeys.Config{Scope: "s", Lease: 2 * time.Minute},
			[]string{"Lease: lease 2m0s is longer than memstore's MaxLease (1m0s)"}},
		{"default lease", bounded, expiringkeys.Config{Scope: "s", Lease: 0},
			nil}, // 30s is within the bound
		{"scope", bounded, expiringkeys.Config{Scope: "123456789"},
			[]string{"Scope: scope of 9 bytes is longer than memstore's MaxScope (8 bytes)", "use a shorter Scope"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := expiringkeys.New(tc.store, tc.cfg)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("New = %v, want no error", err)
				}
				return
			}
			if r != nil || !errors.Is(err, dedup.ErrInvalidConfig) {
				t.Fatalf("New = %v, %v; want an error wrapping dedup.ErrInvalidConfig", r, err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	r := newRepo(t, newMemstore(t, nil), expiringkeys.Config{Scope: "s"})
	got := r.Config()
	if got.Window != expiringkeys.DefaultWindow || got.Lease != expiringkeys.DefaultLease || got.InProgressWait != got.Lease {
		t.Fatalf("Config() = %+v, want Window %s, Lease %s and InProgressWait the Lease", got, expiringkeys.DefaultWindow, expiringkeys.DefaultLease)
	}
	if got := newRepo(t, newMemstore(t, nil), expiringkeys.Config{Scope: "s", Lease: time.Second}).Config(); got.InProgressWait != time.Second {
		t.Fatalf("InProgressWait = %s, want the Lease (1s)", got.InProgressWait)
	}
	if expiringkeys.DefaultWindow != time.Minute {
		t.Fatalf("DefaultWindow = %s, want Watermill's default of one minute", expiringkeys.DefaultWindow)
	}
}

// A key counts as seen for exactly Window after it was marked (to the
// store's precision), and is marked anew after it.
func TestKeySeenForTheWindow(t *testing.T) {
	clock := storetest.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newRepo(t, newMemstore(t, clock), expiringkeys.Config{Scope: "s", Window: time.Hour})
	mustSee(t, r, "k", false, "the first check marks the key")
	clock.Advance(time.Hour - time.Nanosecond)
	mustSee(t, r, "k", true, "a check within the window")
	clock.Advance(time.Nanosecond)
	mustSee(t, r, "k", false, "the window is over")
	mustSee(t, r, "k", true, "the key was marked anew")
	mustSee(t, r, "other", false, "another key")
}

// Scopes keep keys apart; Repositories of one scope share them.
func TestScopes(t *testing.T) {
	store := newMemstore(t, nil)
	a := newRepo(t, store, expiringkeys.Config{Scope: "a"})
	a2 := newRepo(t, store, expiringkeys.Config{Scope: "a"})
	b := newRepo(t, store, expiringkeys.Config{Scope: "b"})
	mustSee(t, a, "k", false, "first in scope a")
	mustSee(t, a2, "k", true, "another Repository of scope a")
	mustSee(t, b, "k", false, "first in scope b")
}

// Keys the store cannot keep fail with stores.ErrInvalidKey, naming the
// KeyFactory or the bound, before the store is called.
func TestKeysRefusedBeforeTheStore(t *testing.T) {
	store := &testkit.HookStore{Store: newMemstore(t, nil), OnCaps: func(c stores.Capabilities) stores.Capabilities {
		c.MaxKey = 8
		return c
	}}
	r := newRepo(t, store, expiringkeys.Config{Scope: "s"})
	for key, want := range map[string]string{
		"":          "the KeyFactory returned an empty key",
		"123456789": "key of 9 bytes is longer than memstore's MaxKey (8 bytes); hash it",
	} {
		dup, err := r.IsDuplicate(context.Background(), key)
		if dup || !errors.Is(err, stores.ErrInvalidKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("IsDuplicate(%q) = %t, %v; want an error wrapping stores.ErrInvalidKey saying %q", key, dup, err, want)
		}
		if errors.Is(err, dedup.ErrStore) {
			t.Errorf("IsDuplicate(%q): %v wraps dedup.ErrStore: no store call failed", key, err)
		}
	}
	if n := store.Claims.Load(); n != 0 {
		t.Fatalf("%d Claims reached the store for keys it refuses", n)
	}
	mustSee(t, r, "12345678", false, "a key of MaxKey bytes")
}

// A store error is an error, never "not a duplicate", and marks nothing.
func TestStoreErrorIsReturned(t *testing.T) {
	var down atomic.Bool
	store := &testkit.HookStore{Store: newMemstore(t, nil)}
	store.OnClaim = func(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
		if down.Load() {
			return nil, stores.ErrUnavailable
		}
		return store.Store.Claim(ctx, scope, keys, lease)
	}
	r := newRepo(t, store, expiringkeys.Config{Scope: "s"})
	down.Store(true)
	dup, err := r.IsDuplicate(context.Background(), "k")
	if dup || !errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, dedup.ErrStore) {
		t.Fatalf("IsDuplicate during an outage = %t, %v; want an error wrapping dedup.ErrStore and stores.ErrUnavailable", dup, err)
	}
	down.Store(false)
	mustSee(t, r, "k", false, "the key was not marked during the outage")
}

func TestCancelledContext(t *testing.T) {
	r := newRepo(t, newMemstore(t, nil), expiringkeys.Config{Scope: "s"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dup, err := r.IsDuplicate(ctx, "k")
	if dup || !errors.Is(err, context.Canceled) {
		t.Fatalf("IsDuplicate with a cancelled context = %t, %v; want context.Canceled", dup, err)
	}
	mustSee(t, r, "k", false, "the cancelled call marked nothing")
}

// A Complete that failed without effect releases the claim, so the retry
// marks the key; also when it failed because the call's context ended.
func TestFailedCompleteReleasesTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(ctx context.Context, cancel context.CancelFunc) error
		want error
	}{
		{"outage", func(context.Context, context.CancelFunc) error { return stores.ErrUnavailable }, stores.ErrUnavailable},
		{"context ended", func(ctx context.Context, cancel context.CancelFunc) error {
			cancel()
			return ctx.Err()
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &testkit.HookStore{Store: newMemstore(t, nil)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var failed atomic.Bool
			store.OnComplete = func(cctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
				if failed.CompareAndSwap(false, true) {
					return tc.fail(ctx, cancel)
				}
				return store.Store.Complete(cctx, c, retention, data)
			}
			r := newRepo(t, store, expiringkeys.Config{Scope: "s"})
			dup, err := r.IsDuplicate(ctx, "k")
			if dup || !errors.Is(err, tc.want) || !errors.Is(err, dedup.ErrStore) {
				t.Fatalf("IsDuplicate = %t, %v; want an error wrapping dedup.ErrStore and %v", dup, err, tc.want)
			}
			mustSee(t, r, "k", false, "the claim was released: the retry marks the key")
			mustSee(t, r, "k", true, "the retry marked it")
		})
	}
}

// A Complete that landed but whose answer was lost is a mark: the release
// finds the claim gone, and the caller is the first.
func TestCompleteWithALostAnswerMarksTheKey(t *testing.T) {
	store := &testkit.HookStore{Store: newMemstore(t, nil)}
	store.OnComplete = func(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
		if err := store.Store.Complete(ctx, c, retention, data); err != nil {
			return err
		}
		return stores.ErrUnavailable
	}
	r := newRepo(t, store, expiringkeys.Config{Scope: "s"})
	mustSee(t, r, "k", false, "the first check, whose Complete landed")
	mustSee(t, r, "k", true, "the key is marked")
}

// When the release of a failed Complete fails too, the error says so and
// the key stays held, and seen, until the lease runs out.
func TestFailedReleaseHoldsTheKeyForTheLease(t *testing.T) {
	clock := storetest.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := &testkit.HookStore{Store: newMemstore(t, clock)}
	var failed atomic.Bool
	store.OnComplete = func(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
		if failed.CompareAndSwap(false, true) {
			return stores.ErrUnavailable
		}
		return store.Store.Complete(ctx, c, retention, data)
	}
	store.OnRelease = func(context.Context, *stores.Claim) error { return stores.ErrUnavailable }
	r := newRepo(t, store, expiringkeys.Config{Scope: "s", Lease: time.Minute, InProgressWait: -1})
	dup, err := r.IsDuplicate(context.Background(), "k")
	if dup || err == nil || !strings.Contains(err.Error(), "the key stays held until its lease (1m0s) runs out") {
		t.Fatalf("IsDuplicate = %t, %v; want an error saying the key stays held", dup, err)
	}
	mustSee(t, r, "k", true, "the claim is held")
	clock.Advance(time.Minute)
	mustSee(t, r, "k", false, "the lease ran out: the key is taken over")
}

// A caller slower than Lease loses its mark to the caller that took the
// key over: one of the two gets false, the other an error wrapping
// stores.ErrLostClaim.
func TestSlowCallerLosesItsMarkToATakeover(t *testing.T) {
	clock := storetest.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := newMemstore(t, clock)
	other := newRepo(t, mem, expiringkeys.Config{Scope: "s", Lease: time.Second})
	store := &testkit.HookStore{Store: mem}
	var otherSaw atomic.Value
	store.OnComplete = func(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
		clock.Advance(time.Second) // the lease runs out before this caller's Complete
		dup, err := other.IsDuplicate(ctx, "k")
		otherSaw.Store([2]any{dup, err})
		return mem.Complete(ctx, c, retention, data)
	}
	slow := newRepo(t, store, expiringkeys.Config{Scope: "s", Lease: time.Second})
	dup, err := slow.IsDuplicate(context.Background(), "k")
	if dup || !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("the slow caller's IsDuplicate = %t, %v; want an error wrapping stores.ErrLostClaim", dup, err)
	}
	if got := otherSaw.Load().([2]any); got[0] != false || got[1] != nil {
		t.Fatalf("the caller that took the key over saw %v, %v; want false, <nil>", got[0], got[1])
	}
	mustSee(t, other, "k", true, "the key is marked")
}

// The PublisherDecorator fails a whole Publish call on an error of
// IsDuplicate, publishing nothing; the messages it marked before the
// error stay marked, so the retry of the call drops them (acked).
func TestDecoratorErrorMidCallDropsTheMarkedMessagesOnRetry(t *testing.T) {
	var failing atomic.Bool
	store := &testkit.HookStore{Store: newMemstore(t, nil)}
	store.OnClaim = func(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
		if failing.Load() && keys[0] == "second" {
			return nil, stores.ErrUnavailable
		}
		return store.Store.Claim(ctx, scope, keys, lease)
	}
	d := &wmw.Deduplicator{
		KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
		Repository: newRepo(t, store, expiringkeys.Config{Scope: "s"}),
	}
	inner := &testkit.Recorder{}
	pub, err := d.PublisherDecorator()(inner)
	if err != nil {
		t.Fatal(err)
	}
	first, second := message.NewMessage("first", nil), message.NewMessage("second", nil)
	failing.Store(true)
	if err := pub.Publish("orders", first, second); !errors.Is(err, stores.ErrUnavailable) {
		t.Fatalf("Publish = %v, want the store's error", err)
	}
	if n := len(inner.UUIDs()); n != 0 {
		t.Fatalf("%d messages published by the failed call, want none", n)
	}
	failing.Store(false)
	retry := []*message.Message{first.Copy(), second.Copy()}
	if err := pub.Publish("orders", retry...); err != nil {
		t.Fatal(err)
	}
	if n := len(inner.UUIDs()); n != 1 {
		t.Fatalf("the retry published %d messages, want 1 (second; first was marked by the failed call)", n)
	}
	select {
	case <-retry[0].Acked():
	default:
		t.Fatal("the retry's first message was neither published nor acked")
	}
}

// A key still held after InProgressWait counts as seen; a call whose
// context ends during the wait fails with dedup.ErrInProgress (a nack),
// and marks nothing.
func TestWaitForAKeyHeldElsewhere(t *testing.T) {
	store := newMemstore(t, nil)
	c := testkit.MustClaim(t, store, "s", time.Hour, "k")
	r := newRepo(t, store, expiringkeys.Config{Scope: "s", InProgressWait: time.Millisecond})
	mustSee(t, r, "k", true, "the key is still held after InProgressWait")

	waiting := &testkit.HookStore{Store: store}
	r = newRepo(t, waiting, expiringkeys.Config{Scope: "s"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.IsDuplicate(ctx, "k")
		done <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "the call claiming the held key again", func() bool { return waiting.Claims.Load() >= 2 })
	cancel()
	if err := <-done; !errors.Is(err, dedup.ErrInProgress) || !errors.Is(err, context.Canceled) {
		t.Fatalf("IsDuplicate whose context ended during the wait = %v, want an error wrapping dedup.ErrInProgress and context.Canceled", err)
	}
	if err := store.Release(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	mustSee(t, r, "k", false, "the call that gave up marked nothing")
}
