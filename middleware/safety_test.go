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
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
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

// onceFailingComplete fails the first Complete it sees with err, an error
// the store does not classify, then passes every call through.
type onceFailingComplete struct {
	stores.Store
	err    error
	failed atomic.Bool
}

func (o *onceFailingComplete) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if o.failed.CompareAndSwap(false, true) {
		return o.err
	}
	return o.Store.Complete(ctx, c, retention, data)
}

// TestCompleteRetriesUnclassifiedErrors: after the handler's effect, a
// Complete that fails with an error the store does not classify (a
// connection reset it did not recognise) is retried like an outage; one
// blip must not leave the record processing for a duplicate arriving
// after the lease to run again. Every mode that completes after the
// handler, with and without data on the record.
func TestCompleteRetriesUnclassifiedErrors(t *testing.T) {
	for _, mode := range []dedup.Mode{dedup.ModeLease, dedup.ModeAsyncComplete} {
		for _, withData := range []bool{false, true} {
			name := mode.String()
			if withData {
				name += "/outputs"
			}
			t.Run(name, func(t *testing.T) {
				clock := storetest.NewFakeClock(time.Unix(1_700_000_000, 0))
				inner, err := memstore.New(memstore.Config{Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = inner.Close(context.Background()) })
				store := &onceFailingComplete{Store: inner, err: errors.New("read tcp 127.0.0.1:50000->127.0.0.1:6379: read: connection reset by peer")}
				mw, err := middleware.New(middleware.Config{Store: store, Mode: mode, Policy: dedup.Policy{Lease: time.Minute, Logger: watermill.NopLogger{}}, Scope: "s"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = mw.Close(context.Background()) })
				var runs atomic.Int32
				h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					runs.Add(1)
					if withData {
						return []*message.Message{message.NewMessage("out-1", []byte("x"))}, nil
					}
					return nil, nil
				})
				if _, err := h(message.NewMessage("m-1", nil)); err != nil {
					t.Fatalf("first delivery: %v", err)
				}
				if err := mw.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				// The lease runs out; a duplicate arrives.
				clock.Advance(2 * time.Minute)
				if _, err := h(message.NewMessage("m-1", nil)); err != nil {
					t.Fatalf("duplicate: %v", err)
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times for one message whose first Complete failed once, want 1", n)
				}
			})
		}
	}
}
