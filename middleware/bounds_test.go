package middleware_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// openStore opens a store of the test's own on a real service, deleted
// at the end of the test.
func openStore(t *testing.T, p anystore.StoreParams) stores.Store {
	t.Helper()
	return openStoreOf(t, p).Store
}

// openStoreOf is openStore, with what the test kit opened with the store
// (its client, its name).
func openStoreOf(t *testing.T, p anystore.StoreParams) *anystore.OpenedStore {
	t.Helper()
	anystore.RequireStore(t, p.Kind)
	p.Teardown, p.CreateSchema = true, true
	o, closeStore, err := anystore.OpenStore(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := closeStore(context.Background()); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return o
}

// TestRealStoreBoundsRefusedAtNew: on the real stores, a setting beyond
// what the store keeps fails at New, in the middleware and the publisher,
// naming both values — never after the effect, at the first Complete. A
// natsstore's MaxRetention and MaxLease, a partitioned PostgreSQL
// sqlstore's PartitionDaysAhead, a redisstore's MaxKeyLen against the
// scope.
func TestRealStoreBoundsRefusedAtNew(t *testing.T) {
	cases := []struct {
		name   string
		params anystore.StoreParams
		policy dedup.Policy
		mode   dedup.Mode
		scope  string
		want   []string
	}{
		{
			name:   "natsstore retention",
			params: anystore.StoreParams{Kind: anystore.StoreNATS, NATS: natsstore.Config{MaxRetention: time.Hour}},
			policy: dedup.Policy{Retention: 2 * time.Hour},
			want:   []string{"Retention: retention 2h0m0s", "natsstore", "MaxRetention (1h0m0s)"},
		},
		{
			name:   "natsstore default retention",
			params: anystore.StoreParams{Kind: anystore.StoreNATS, NATS: natsstore.Config{MaxRetention: time.Hour}},
			want:   []string{"Retention: retention 24h0m0s", "MaxRetention (1h0m0s)"},
		},
		{
			name:   "natsstore lease",
			params: anystore.StoreParams{Kind: anystore.StoreNATS, NATS: natsstore.Config{MaxLease: time.Minute}},
			policy: dedup.Policy{Lease: 2 * time.Minute},
			want:   []string{"Lease: lease 2m0s", "MaxLease (1m0s)"},
		},
		{
			name:   "partitioned postgres lease",
			params: anystore.StoreParams{Kind: anystore.StorePostgres, SQL: sqlstore.Config{DailyPartitions: true, PartitionDaysAhead: 2, PurgeInterval: time.Hour}},
			policy: dedup.Policy{Lease: 72 * time.Hour, Retention: 40 * time.Hour},
			want:   []string{"Lease: lease 72h0m0s", "MaxLease (48h0m0s)", "raise sqlstore.Config.PartitionDaysAhead"},
		},
		{
			name:   "partitioned postgres retention",
			params: anystore.StoreParams{Kind: anystore.StorePostgres, SQL: sqlstore.Config{DailyPartitions: true, PartitionDaysAhead: 2, PurgeInterval: time.Hour}},
			policy: dedup.Policy{Retention: 72 * time.Hour},
			want:   []string{"Retention: retention 72h0m0s", "DailyPartitions", "MaxRetention (48h0m0s)", "raise sqlstore.Config.PartitionDaysAhead"},
		},
		{
			name:   "partitioned postgres retention, transactional",
			params: anystore.StoreParams{Kind: anystore.StorePostgres, SQL: sqlstore.Config{DailyPartitions: true, PartitionDaysAhead: 2, PurgeInterval: time.Hour}},
			policy: dedup.Policy{Retention: 72 * time.Hour},
			mode:   dedup.ModeTransactional,
			want:   []string{"Retention: retention 72h0m0s", "MaxRetention (48h0m0s)"},
		},
		{
			name:   "redisstore scope",
			params: anystore.StoreParams{Kind: anystore.StoreRedis, Redis: redisstore.Config{MaxKeyLen: 16}},
			scope:  strings.Repeat("s", 17),
			want:   []string{"Scope: scope of 17 bytes", "redisstore", "MaxScope (16 bytes)"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := openStore(t, tc.params)
			_, err := middleware.New(middleware.Config{Store: store, Mode: tc.mode, Scope: tc.scope, Policy: tc.policy})
			checkRefusal(t, "middleware.New", err, tc.want)
			_, err = publisher.New(publisher.Config{Store: store, Mode: tc.mode, Scope: tc.scope, Policy: tc.policy})
			checkRefusal(t, "publisher.New", err, tc.want)
		})
	}
}

func checkRefusal(t *testing.T, what string, err error, want []string) {
	t.Helper()
	if !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("%s = %v, want an error wrapping dedup.ErrInvalidConfig", what, err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", what, err, s)
		}
	}
}

// TestRealStoreRefusesWhatItCannotHoldBeforeTheHandler: what can only be
// known per message — the scope of a handler (its name), the outputs — is
// refused before the handler runs, or recorded without what the store
// cannot keep; a message is never run twice for it. On NATS, whose
// payload limit bounds a record's data.
func TestRealStoreRefusesWhatItCannotHoldBeforeTheHandler(t *testing.T) {
	t.Run("outputs larger than the store keeps", func(t *testing.T) {
		store := openStore(t, anystore.StoreParams{Kind: anystore.StoreNATS})
		maxData := store.Capabilities().MaxData
		if maxData <= 0 {
			t.Fatalf("natsstore states no MaxData")
		}
		mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "big", Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
		var runs atomic.Int32
		h := mw(func(*message.Message) ([]*message.Message, error) {
			runs.Add(1)
			return []*message.Message{message.NewMessage("out-1", make([]byte, maxData+1))}, nil
		})
		for range 2 {
			if _, err := h(message.NewMessage("m-1", nil)); err != nil {
				t.Fatal(err)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want 1: the record must be done (without the outputs it cannot keep)", n)
		}
	})
	t.Run("handler name longer than the store keeps", func(t *testing.T) {
		store := openStore(t, anystore.StoreParams{Kind: anystore.StoreRedis, Redis: redisstore.Config{MaxKeyLen: 16}})
		mw := dedupMiddleware(t, middleware.Config{Store: store, Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
		var runs atomic.Int32
		errs := make(chan error, 100)
		ps := newPubSub(t)
		r := newRouter(t)
		r.AddNoPublisherHandler(strings.Repeat("h", 17), "t", ps, func(*message.Message) error {
			runs.Add(1)
			return nil
		}).AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				select {
				case errs <- err:
				default:
				}
				return out, err
			}
		}, mw)
		runRouter(t, r)
		publish(t, ps, "t", message.NewMessage("m-1", nil))
		if err := <-errs; !errors.Is(err, stores.ErrInvalidArgument) || runs.Load() != 0 {
			t.Fatalf("err = %v, runs = %d; want the Claim refused with ErrInvalidArgument and the handler not run", err, runs.Load())
		}
	})
}

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
