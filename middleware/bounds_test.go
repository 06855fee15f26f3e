package middleware_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// boundedStore is a store stating bounds of its own (as natsstore's
// MaxRetention or sqlstore's PartitionDaysAhead do) and enforcing them,
// like the real stores, only when a call carries the duration.
type boundedStore struct {
	stores.Store
	caps stores.Capabilities
}

func (b boundedStore) Capabilities() stores.Capabilities { return b.caps }

func (b boundedStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if err := b.caps.CheckRetention(retention); err != nil {
		return err
	}
	return b.Store.Complete(ctx, c, retention, data)
}

// TestNewRefusesWhatTheStoreCannotHold: a Retention or Lease beyond the
// store's bounds fails at New, naming both values, before any handler
// runs — not at the first Complete, after the effect.
func TestNewRefusesWhatTheStoreCannotHold(t *testing.T) {
	base := newMemstore(t)
	store := boundedStore{Store: base, caps: stores.Capabilities{Kind: "bounded", MaxLease: time.Minute, MaxRetention: time.Hour}}
	for _, tc := range []struct {
		name string
		cfg  middleware.Config
		want []string
	}{
		{"retention", middleware.Config{Store: store, Policy: dedup.Policy{Lease: time.Second, Retention: 2 * time.Hour}}, []string{"Retention", "2h0m0s", "1h0m0s"}},
		{"default retention", middleware.Config{Store: store, Policy: dedup.Policy{Lease: time.Second}}, []string{"Retention", "24h0m0s", "1h0m0s"}},
		{"lease", middleware.Config{Store: store, Policy: dedup.Policy{Lease: 2 * time.Minute, Retention: time.Hour}}, []string{"Lease", "2m0s", "1m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := middleware.New(tc.cfg)
			if !errors.Is(err, dedup.ErrInvalidConfig) {
				t.Fatalf("New = %v, want an error wrapping ErrInvalidConfig", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
	if _, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Lease: time.Minute, Retention: time.Hour}}); err != nil {
		t.Fatalf("New at the bounds = %v, want nil", err)
	}
}

// TestTinyAndHugeDurations: every duration Validate accepts works. A 1ns
// heartbeat (also the default one of a 3ns lease) used to make the
// heartbeat loop call time.NewTicker(0), which panics in a goroutine of
// its own and kills the process; math.MaxInt64 leases, heartbeats,
// retentions and timeouts must not overflow either.
func TestTinyAndHugeDurations(t *testing.T) {
	for _, cfg := range []middleware.Config{
		{Policy: dedup.Policy{Tuning: dedup.Tuning{Heartbeat: time.Nanosecond}}},
		{Policy: dedup.Policy{Lease: 3 * time.Nanosecond}},
		{Policy: dedup.Policy{Lease: time.Nanosecond, Tuning: dedup.Tuning{Heartbeat: -1}}},
		{Policy: dedup.Policy{Lease: math.MaxInt64, Retention: math.MaxInt64, StoreTimeout: math.MaxInt64, Tuning: dedup.Tuning{CompleteTimeout: math.MaxInt64}}},
		{Policy: dedup.Policy{Lease: math.MaxInt64, Tuning: dedup.Tuning{Heartbeat: math.MaxInt64 - 1}}},
		{Policy: dedup.Policy{InProgressWait: math.MaxInt64, Tuning: dedup.Tuning{InProgressPoll: time.Nanosecond}}},
		{Mode: dedup.ModeAsyncComplete, Policy: dedup.Policy{Lease: math.MaxInt64, StoreTimeout: math.MaxInt64, Tuning: dedup.Tuning{CompleteLinger: math.MaxInt64 - 1}}},
		{Mode: dedup.ModeAsyncComplete, Policy: dedup.Policy{Lease: 3 * time.Nanosecond, Tuning: dedup.Tuning{CompleteLinger: -1}}},
	} {
		cfg.Store = newMemstore(t)
		cfg.Scope = "s"
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", cfg, err)
		}
		mw := testkit.DedupMiddleware(t, cfg)
		ran := 0
		h := mw(func(*message.Message) ([]*message.Message, error) {
			ran++
			time.Sleep(5 * time.Millisecond) // a few heartbeat ticks
			return nil, nil
		})
		for range 2 {
			if _, err := h(message.NewMessage("m-1", nil)); err != nil {
				t.Fatalf("%+v: %v", cfg, err)
			}
		}
		if ran != 1 && cfg.Lease > time.Second {
			t.Fatalf("%+v: the handler ran %d times for a message delivered twice", cfg, ran)
		}
	}
}
