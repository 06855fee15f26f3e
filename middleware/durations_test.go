package middleware_test

import (
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
)

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
		mw := dedupMiddleware(t, cfg)
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
