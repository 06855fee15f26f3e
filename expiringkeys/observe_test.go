package expiringkeys_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// downStore is a store whose calls fail with an outage.
type downStore struct{ stores.Store }

func (downStore) Claim(context.Context, string, []string, time.Duration) (*stores.Claim, error) {
	return nil, stores.ErrUnavailable
}

// TestOutcomesAndStoreCallsAreObserved: every IsDuplicate reports one
// outcome to Config.Metrics, by Scope, and every store call its latency
// and error, as the middleware does.
func TestOutcomesAndStoreCallsAreObserved(t *testing.T) {
	store := testkit.Memstore(t, nil)
	m := &testkit.Metrics{}
	r, err := expiringkeys.New(store, expiringkeys.Config{Scope: "observed", Metrics: m, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, want := range []bool{false, true} {
		if seen, err := r.IsDuplicate(ctx, "k"); err != nil || seen != want {
			t.Fatalf("call %d: IsDuplicate = %v, %v; want %v", i, seen, err, want)
		}
	}
	if _, err := r.IsDuplicate(ctx, ""); !errors.Is(err, stores.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.IsDuplicate(cancelled, "other"); err == nil {
		t.Fatal("IsDuplicate under a cancelled context succeeded")
	}
	down, err := expiringkeys.New(downStore{store}, expiringkeys.Config{Scope: "observed", Metrics: m, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := down.IsDuplicate(ctx, "k"); !errors.Is(err, dedup.ErrStore) {
		t.Fatalf("a store that is down: %v", err)
	}

	for o, want := range map[dedup.Outcome]int{
		dedup.OutcomeClaimed: 1, dedup.OutcomeDuplicate: 1, dedup.OutcomeNoKey: 1,
		dedup.OutcomeCancelled: 1, dedup.OutcomeStoreError: 1,
	} {
		if got := m.ScopeOutcome("observed", o); got != want {
			t.Errorf("%s in scope observed: %d, want %d (all: %v)", o, got, want, m.Outcomes())
		}
	}
	for op, want := range map[string]int{dedup.OpClaim: 4, dedup.OpComplete: 1} {
		if got := m.Calls(op); got != want {
			t.Errorf("%s calls: %d, want %d", op, got, want)
		}
	}
	if got := m.Failed(dedup.OpClaim); got != 2 {
		t.Errorf("failed claims: %d, want 2 (the cancelled one, the outage)", got)
	}
}

// TestHeldKeyCountedAsSeenIsLoggedAndCounted: a key another caller still
// holds after InProgressWait counts as seen, so the Deduplicator drops
// its message; that is never silent: a line names the scope and the key,
// and it counts as OutcomeInProgress.
func TestHeldKeyCountedAsSeenIsLoggedAndCounted(t *testing.T) {
	store := testkit.Memstore(t, nil)
	testkit.MustClaim(t, store, "held", time.Minute, "k")
	m := &testkit.Metrics{}
	log := watermill.NewCaptureLogger()
	r, err := expiringkeys.New(store, expiringkeys.Config{Scope: "held", InProgressWait: 50 * time.Millisecond, Metrics: m, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if seen, err := r.IsDuplicate(context.Background(), "k"); err != nil || !seen {
		t.Fatalf("IsDuplicate of a held key = %v, %v; want true (seen) after the wait", seen, err)
	}
	if got := m.ScopeOutcome("held", dedup.OutcomeInProgress); got != 1 {
		t.Fatalf("in_progress outcomes: %d, want 1 (all: %v)", got, m.Outcomes())
	}
	lines := log.Captured()[watermill.InfoLogLevel]
	if len(lines) != 1 || lines[0].Fields["scope"] != "held" || lines[0].Fields["key"] != "k" {
		t.Fatalf("info lines %+v, want one naming scope held and key k", lines)
	}
}

// TestDefaultLoggerAndMetrics: the zero Config logs through log/slog's
// default logger, as the middleware's Policy does, and discards metrics.
func TestDefaultLoggerAndMetrics(t *testing.T) {
	cfg := expiringkeys.Config{Scope: "s"}.WithDefaults()
	if cfg.Logger == nil || cfg.Metrics == nil {
		t.Fatalf("defaults: Logger %v, Metrics %v", cfg.Logger, cfg.Metrics)
	}
	if _, ok := cfg.Metrics.(dedup.NopMetrics); !ok {
		t.Fatalf("default Metrics %T, want dedup.NopMetrics", cfg.Metrics)
	}
}

// TestTakeoverIsLoggedAndCounted: a claim that takes over a key whose
// holder's lease ran out (a caller that died between its two calls, or
// one slower than Lease) is where two callers can both get false for a
// key; it counts as OutcomeTakeover, beside the call's own outcome, and
// is logged, as the middleware does.
func TestTakeoverIsLoggedAndCounted(t *testing.T) {
	clock := storetest.NewFakeClock(time.Now())
	store := testkit.Memstore(t, clock)
	testkit.MustClaim(t, store, "taken", time.Second, "k")
	clock.Advance(2 * time.Second)
	m := &testkit.Metrics{}
	log := watermill.NewCaptureLogger()
	r, err := expiringkeys.New(store, expiringkeys.Config{Scope: "taken", Metrics: m, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if seen, err := r.IsDuplicate(context.Background(), "k"); err != nil || seen {
		t.Fatalf("IsDuplicate of a key whose lease ran out = %v, %v; want false (marked now)", seen, err)
	}
	for o, want := range map[dedup.Outcome]int{dedup.OutcomeTakeover: 1, dedup.OutcomeClaimed: 1} {
		if got := m.ScopeOutcome("taken", o); got != want {
			t.Errorf("%s: %d, want %d (all: %v)", o, got, want, m.Outcomes())
		}
	}
	lines := log.Captured()[watermill.InfoLogLevel]
	if len(lines) != 1 || lines[0].Fields["key"] != "k" {
		t.Fatalf("info lines %+v, want one naming key k", lines)
	}
}

// refusingStore refuses every key, as a backend may refuse one this
// package's own check let through.
type refusingStore struct{ stores.Store }

func (refusingStore) Claim(context.Context, string, []string, time.Duration) (*stores.Claim, error) {
	return nil, fmt.Errorf("the backend refuses this key: %w", stores.ErrInvalidKey)
}

// TestKeyTheStoreRefusesIsNoKey: a key the store refuses counts as
// OutcomeNoKey, as the middleware counts it, not as a store error.
func TestKeyTheStoreRefusesIsNoKey(t *testing.T) {
	m := &testkit.Metrics{}
	r, err := expiringkeys.New(refusingStore{testkit.Memstore(t, nil)}, expiringkeys.Config{Scope: "s", Metrics: m, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.IsDuplicate(context.Background(), "k"); !errors.Is(err, stores.ErrInvalidKey) {
		t.Fatalf("IsDuplicate = %v, want an error wrapping stores.ErrInvalidKey", err)
	}
	if got := m.Outcome(dedup.OutcomeNoKey); got != 1 {
		t.Fatalf("no_key outcomes: %d, want 1 (all: %v)", got, m.Outcomes())
	}
}

// TestDefaultLoggerFollowsSlog: with no Logger, lines go to log/slog's
// default logger as it is when they are logged.
func TestDefaultLoggerFollowsSlog(t *testing.T) {
	store := testkit.Memstore(t, nil)
	testkit.MustClaim(t, store, "slog", time.Minute, "k")
	r, err := expiringkeys.New(store, expiringkeys.Config{Scope: "slog", InProgressWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	if seen, err := r.IsDuplicate(context.Background(), "k"); err != nil || !seen {
		t.Fatalf("IsDuplicate = %v, %v", seen, err)
	}
	if !strings.Contains(buf.String(), "counted as seen") || !strings.Contains(buf.String(), "scope=slog") {
		t.Fatalf("slog's default logger got %q, want the held key's line", buf.String())
	}
}
