package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
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
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "big", Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
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
		mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Policy: dedup.Policy{Logger: watermill.NopLogger{}}})
		var runs atomic.Int32
		errs := make(chan error, 100)
		ps := testkit.NewPubSub(t)
		r := testkit.NewRouter(t)
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
		testkit.RunRouter(t, r)
		testkit.Publish(t, ps, "t", message.NewMessage("m-1", nil))
		if err := <-errs; !errors.Is(err, stores.ErrInvalidArgument) || runs.Load() != 0 {
			t.Fatalf("err = %v, runs = %d; want the Claim refused with ErrInvalidArgument and the handler not run", err, runs.Load())
		}
	})
}
