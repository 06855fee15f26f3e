package middleware_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// notReplicatedStore is redisstore with WaitReplicas whose replica does
// not acknowledge the first fails Completes: each lands on the master
// (the wrapped store records it) and then fails with ErrNotReplicated;
// so does the refusal a retry meets while the replica is away (the store
// confirms refusals too).
type notReplicatedStore struct {
	stores.Store
	fails     int32
	completes atomic.Int32
}

func (s *notReplicatedStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	err := s.Store.Complete(ctx, c, retention, data)
	if s.completes.Add(1) <= s.fails {
		return fmt.Errorf("redisstore: complete: %w: 0 of 1 replicas of 127.0.0.1:7000 acknowledged the write within 1s", redisstore.ErrNotReplicated)
	}
	return err
}

// TestCompleteNotReplicatedIsRetried: a Complete that fails with
// redisstore.ErrNotReplicated is not permanent: the middleware retries it
// under CompleteTimeout; the retry that the replica confirms finds the
// record its first attempt wrote done, is refused, and is reconciled: the
// message is acked once, with the outputs the record holds, the handler
// ran once, and nothing is counted lost or failed.
func TestCompleteNotReplicatedIsRetried(t *testing.T) {
	store := &notReplicatedStore{Store: newMemstore(t), fails: 3}
	metrics := &testkit.Metrics{}
	mw := dedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Metrics: metrics, Lease: time.Hour}})
	var runs atomic.Int32
	h := mw(func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage("out-1", []byte("points"))}, nil
	})
	out, err := h(message.NewMessage("m-1", nil))
	if err != nil {
		t.Fatalf("a Complete not replicated three times, then confirmed: %v, want an ack", err)
	}
	if len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("outputs = %v, want out-1 (the record's)", out)
	}
	if n := store.completes.Load(); n != 4 {
		t.Fatalf("%d Complete attempts, want 4 (3 not replicated, then the confirmed refusal)", n)
	}
	for _, o := range []dedup.Outcome{dedup.OutcomeStoreError, dedup.OutcomeLostClaim} {
		if n := metrics.Outcome(o); n != 0 {
			t.Errorf("outcome %s counted %d times, want 0 (outcomes %v)", o, n, metrics.Outcomes())
		}
	}
	// The redelivery is a Duplicate with the outputs: the record was kept,
	// data and all.
	out, err = h(message.NewMessage("m-1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("redelivery = %v, %v; want the recorded out-1", out, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}
