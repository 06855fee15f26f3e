package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestClusterReplicaLagFailOpen: a master of a Redis Cluster has no
// synced replica (it is stopped), and a fail-open consumer whose store
// calls time out a little after WaitTimeout gets many messages at once,
// claiming one key on that master, or two (one on another master), with
// a client pool smaller than the calls (they wait for connections the
// WAITs hold). No claim can be replicated: every one must fail with
// ErrNotReplicated, and no handler may run. A deadline, an i/o timeout
// or a pool timeout of the store's own making is an outage to the
// middleware, which FailOpen runs handlers through unprotected.
func TestClusterReplicaLagFailOpen(t *testing.T) {
	fc := startFaultCluster(t)
	for _, tc := range []struct {
		name        string
		unbatched   bool
		pool        int
		poolTimeout time.Duration
		inFlight    int
	}{
		{"Batched", false, 4, 0, 0},
		{"Unbatched", true, 4, 0, 0},
		{"BatchedPoolTimeout", false, 4, 300 * time.Millisecond, 0},
		{"UnbatchedPoolTimeout", true, 4, 300 * time.Millisecond, 0},
		{"BatchedWiderThanPool", false, 4, 300 * time.Millisecond, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:                 fc.addrs,
				ContextTimeoutEnabled: true,
				ReadTimeout:           10 * time.Second,
				PoolSize:              tc.pool,
				PoolTimeout:           tc.poolTimeout,
			})
			t.Cleanup(func() { _ = cc.Close() })
			s := newStore(t, cc, redisstore.Config{WaitReplicas: 1, WaitTimeout: time.Second,
				Batch: redisstore.BatchConfig{Disabled: tc.unbatched, MaxInFlight: tc.inFlight}})

			fc.waitOK(t, "before the replica stops")
			lagging, replica := fc.pair(t, 1)
			healthy, _ := fc.pair(t, 2)
			fc.byAddr[replica].Pause()
			t.Cleanup(func() {
				fc.byAddr[replica].Resume()
				fc.waitOK(t, "after the replica resumed")
			})

			var outages recorded
			mw, err := middleware.New(middleware.Config{
				Store: &recording{Store: s, errs: &outages},
				Scope: "h",
				Key: func(m *message.Message) ([]string, error) {
					if b := m.Metadata.Get("b"); b != "" {
						return []string{m.Metadata.Get("a"), b}, nil
					}
					return []string{m.Metadata.Get("a")}, nil
				},
				Policy: dedup.Policy{
					Lease:        time.Minute,
					Retention:    time.Hour,
					StoreTimeout: 1200 * time.Millisecond,
					OnStoreError: dedup.FailOpen,
					Logger:       watermill.NopLogger{},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int64
			h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
				ran.Add(1)
				return nil, nil
			})
			const n = 64
			msgs := make([]*message.Message, n)
			for i := range msgs {
				m := message.NewMessage(watermill.NewUUID(), []byte("p"))
				m.Metadata.Set("a", keyOnNode(t, cc, s, "h", fmt.Sprintf("a%d", i), lagging))
				if i%2 == 0 {
					m.Metadata.Set("b", keyOnNode(t, cc, s, "h", fmt.Sprintf("b%d", i), healthy))
				}
				msgs[i] = m
			}
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				other []string
			)
			start := make(chan struct{})
			for _, m := range msgs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if _, err := h(m); err != nil && !errorsIsNotReplicated(err) {
						mu.Lock()
						other = append(other, err.Error())
						mu.Unlock()
					}
				}()
			}
			close(start)
			wg.Wait()
			if r := ran.Load(); r > 0 || len(other) > 0 {
				t.Errorf("FailOpen with a master's replica stopped: %d of %d handlers ran unprotected; %d failed otherwise than not replicated, e.g. %v; store errors not ErrNotReplicated: %v", r, n, len(other), first(other), outages.list())
			}
		})
	}
}

func errorsIsNotReplicated(err error) bool {
	return errors.Is(err, redisstore.ErrNotReplicated)
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// recording is a store that records the errors of its calls that are
// not ErrNotReplicated.
type recording struct {
	stores.Store
	errs *recorded
}

func (r *recording) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	c, err := r.Store.Claim(ctx, scope, keys, lease)
	r.errs.add(err)
	return c, err
}

type recorded struct {
	mu   sync.Mutex
	errs map[string]int
}

func (r *recorded) add(err error) {
	if err == nil || errors.Is(err, redisstore.ErrNotReplicated) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[string]int{}
	}
	r.errs[err.Error()]++
}

func (r *recorded) list() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}
