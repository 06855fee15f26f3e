package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
)

func TestPolicyValidate(t *testing.T) {
	for name, p := range map[string]dedup.Policy{
		"negative lease":            {Lease: -1},
		"negative retention":        {Retention: -1},
		"negative store timeout":    {StoreTimeout: -1},
		"negative in-progress wait": {InProgressWait: -1},
		"unknown store err policy":  {OnStoreError: dedup.FailOpen + 1},
		"negative complete timeout": {Tuning: dedup.Tuning{CompleteTimeout: -1}},
		"negative poll":             {Tuning: dedup.Tuning{InProgressPoll: -1}},
		"heartbeat = lease":         {Lease: time.Second, Tuning: dedup.Tuning{Heartbeat: time.Second}},
		"heartbeat = default lease": {Tuning: dedup.Tuning{Heartbeat: dedup.DefaultLease}},
	} {
		err := p.Validate()
		if !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	for name, p := range map[string]dedup.Policy{
		"zero":                        {},
		"heartbeat below lease":       {Lease: time.Second, Tuning: dedup.Tuning{Heartbeat: time.Second - 1}},
		"heartbeat disabled":          {Tuning: dedup.Tuning{Heartbeat: -1}},
		"fail-open":                   {OnStoreError: dedup.FailOpen},
		"heartbeat below the default": {Tuning: dedup.Tuning{Heartbeat: dedup.DefaultLease - 1}},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("%s: Validate = %v, want nil", name, err)
		}
	}
}

func TestPolicyDefaults(t *testing.T) {
	p := dedup.Policy{}.WithDefaults()
	if p.Lease != 30*time.Second || p.Retention != 24*time.Hour || p.StoreTimeout != 5*time.Second ||
		p.Tuning.Heartbeat != 10*time.Second || p.Tuning.CompleteTimeout != 30*time.Second || p.Tuning.InProgressPoll != 100*time.Millisecond ||
		p.InProgressWait != 0 || p.OnStoreError != dedup.FailClosed || p.Logger == nil || p.Metrics == nil {
		t.Fatalf("defaults %+v", p)
	}
	if _, ok := p.Metrics.(dedup.NopMetrics); !ok {
		t.Fatalf("default metrics %T, want NopMetrics", p.Metrics)
	}
	// Derived defaults follow the lease; set values are kept.
	q := dedup.Policy{Lease: 9 * time.Second, Retention: time.Minute, StoreTimeout: time.Second, Logger: watermill.NopLogger{},
		Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}.WithDefaults()
	if q.Tuning.Heartbeat != 3*time.Second || q.Tuning.CompleteTimeout != 9*time.Second || q.Retention != time.Minute || q.StoreTimeout != time.Second || q.Tuning.InProgressPoll != time.Millisecond {
		t.Fatalf("defaults of %+v", q)
	}
	if _, ok := q.Logger.(watermill.NopLogger); !ok {
		t.Fatal("a logger of one's own was replaced")
	}
	r := dedup.Policy{Tuning: dedup.Tuning{Heartbeat: time.Second, CompleteTimeout: time.Minute}}.WithDefaults()
	if r.Tuning.Heartbeat != time.Second || r.Tuning.CompleteTimeout != time.Minute {
		t.Fatalf("set tuning replaced: %+v", r.Tuning)
	}
	dedup.NopMetrics{}.Observe("s", dedup.OutcomeClaimed)
	dedup.NopMetrics{}.ObserveStore("s", dedup.OpClaim, time.Second, nil)
}

func TestNames(t *testing.T) {
	for v, want := range map[fmt.Stringer]string{
		dedup.FailClosed: "fail-closed", dedup.FailOpen: "fail-open", dedup.FailOpen + 1: "StoreErrorPolicy(2)",
		dedup.ModeLease: "lease", dedup.ModeAsyncComplete: "async-complete", dedup.ModeTransactional: "transactional", dedup.ModeTransactional + 1: "Mode(3)",
		dedup.OutcomeClaimed: "claimed", dedup.OutcomeCorruptRecord: "corrupt_record", dedup.Outcome(0): "unknown", dedup.OutcomeCorruptRecord + 1: "unknown",
	} {
		if got := v.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", v, got, want)
		}
	}
	all := dedup.Outcomes()
	if len(all) != int(dedup.OutcomeCorruptRecord) || all[0] != dedup.OutcomeClaimed || all[len(all)-1] != dedup.OutcomeCorruptRecord {
		t.Fatalf("Outcomes() = %v", all)
	}
	seen := map[string]bool{}
	for _, o := range all {
		if n := o.String(); n == "unknown" || seen[n] {
			t.Errorf("outcome %d is named %q", o, n)
		}
		seen[o.String()] = true
	}
}

func TestIsPermanent(t *testing.T) {
	for _, err := range []error{keyfuncs.ErrNoKey, dedup.ErrFingerprintMismatch, dedup.ErrCorruptRecord, fmt.Errorf("x: %w", dedup.ErrCorruptRecord)} {
		if !dedup.IsPermanent(err) {
			t.Errorf("IsPermanent(%v) = false", err)
		}
	}
	for _, err := range []error{nil, dedup.ErrStore, dedup.ErrInProgress, dedup.ErrInvalidConfig, context.Canceled} {
		if dedup.IsPermanent(err) {
			t.Errorf("IsPermanent(%v) = true", err)
		}
	}
}

// TestDefaultLogger: the default logger writes through log/slog's default
// logger as it is at each line, with the fields it was given With.
func TestDefaultLogger(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	l := dedup.Policy{}.WithDefaults().Logger.With(watermill.LogFields{"a": 1})
	var buf bytes.Buffer
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.Level(-8)})))
	l.Error("e-line", errors.New("boom"), watermill.LogFields{"b": 2})
	l.Info("i-line", nil)
	l.Debug("d-line", nil)
	l.Trace("t-line", nil)
	out := buf.String()
	for _, want := range []string{"level=ERROR msg=e-line", "a=1", "b=2", "boom", "level=INFO msg=i-line", "level=DEBUG msg=d-line", "t-line"} {
		if !strings.Contains(out, want) {
			t.Errorf("the default logger wrote %q, without %q", out, want)
		}
	}
}

func TestRetentionShorterThanHorizon(t *testing.T) {
	err := dedup.CheckHorizon(time.Hour, time.Hour)
	if !errors.Is(err, dedup.ErrRetentionTooShort) || !strings.Contains(err.Error(), "1h18m0s") {
		t.Fatalf("CheckHorizon(1h, 1h) = %v, want ErrRetentionTooShort naming the 1h18m minimum", err)
	}
	if err := dedup.CheckHorizon(2*time.Hour, time.Hour); err != nil {
		t.Fatalf("2h retention over a 1h horizon: %v", err)
	}
	// An unknown (zero or negative) horizon is never too long, whatever
	// the retention.
	for _, r := range []time.Duration{time.Hour, time.Nanosecond, -time.Second} {
		for _, h := range []time.Duration{0, -time.Hour} {
			if err := dedup.CheckHorizon(r, h); err != nil {
				t.Fatalf("CheckHorizon(%s, %s), an unknown horizon: %v", r, h, err)
			}
		}
	}
	// Zero is the default retention, 24h.
	if err := dedup.CheckHorizon(0, 18*time.Hour); err != nil {
		t.Fatalf("default retention over an 18h horizon: %v", err)
	}
	if err := dedup.CheckHorizon(0, 19*time.Hour); !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("default retention over a 19h horizon: %v, want ErrRetentionTooShort", err)
	}
}

// TestHugeRedeliveryHorizon: the retention check saturates instead of
// overflowing (1.3 x math.MaxInt64 is no duration).
func TestHugeRedeliveryHorizon(t *testing.T) {
	if err := dedup.CheckHorizon(24*time.Hour, math.MaxInt64); !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("CheckHorizon(24h, math.MaxInt64) = %v, want ErrRetentionTooShort", err)
	}
	if err := dedup.CheckHorizon(math.MaxInt64, math.MaxInt64); err != nil {
		t.Fatalf("CheckHorizon(math.MaxInt64, math.MaxInt64) = %v, want nil (the longest retention covers any horizon)", err)
	}
}

// A horizon whose 1.3x is exactly 2^63 ns (one past the longest duration)
// still asks for the longest retention, and no shorter one passes.
func TestRedeliveryHorizonAtTheLimit(t *testing.T) {
	const h = 7094901566811364864 // float64(h) * 1.3 == 2^63
	err := dedup.CheckHorizon(0, h)
	if !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("CheckHorizon with the default retention and a horizon of %s = %v, want ErrRetentionTooShort", time.Duration(h), err)
	}
}
