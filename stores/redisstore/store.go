package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// serverCheckTimeout bounds the check New starts in the background.
const serverCheckTimeout = 10 * time.Second

// Store is the Redis store. Create it with New.
type Store struct {
	client redis.UniversalClient
	cfg    Config

	// sharded is true when the keys of one claim may live on different
	// nodes, so a script may only touch one key (see claimOrdered and
	// fencedSharded).
	sharded bool

	// noSetNXGet is set once a server refused SET NX GET (Redis < 7.0):
	// single-key claims then always run the claim script.
	noSetNXGet atomic.Bool

	// serverMaxData is the most data every node CheckServer read takes
	// (its proto-max-bulk-len less one), when below Config.MaxData; 0
	// while unknown or not below.
	serverMaxData atomic.Int64

	// The lanes coalesce concurrent ops into pipelines (pipeline.go):
	// lane0 when the keys of a call live on one node, else one lane a
	// node, by address, in lanes (*lane), made on first use until Close
	// sets lanesClosed. None when Batch.Disabled.
	lane0       *lane
	lanes       sync.Map
	lanesMu     sync.Mutex
	lanesClosed bool

	// redirects counts the MOVED and ASK replies followed by waited
	// pipelines (WaitReplicas), for the tests.
	redirects atomic.Int64
	// waits holds each node's pipelines with WAIT (*nodeWaits), by
	// address, with WaitReplicas (see cutByWait).
	waits sync.Map

	closed    atomic.Bool
	closeOnce sync.Once
	cancel    context.CancelFunc
	checkDone chan struct{}
	closeD    chan struct{} // closed when Close has stopped everything

	// The store's background work: the undos of failed claims (see
	// background). bgCtx ends when a Close gives up waiting for it; bg
	// counts it, and bgClosed, under bgMu, stops new work once Close
	// waits for bg.
	bgCtx    context.Context
	bgStop   context.CancelFunc
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup
}

var _ stores.Store = (*Store)(nil)

// New returns a Store on client. It never closes client: Close the client
// yourself after closing the Store.
//
// Unless cfg.SkipServerCheck is set, New starts [Store.CheckServer] in the
// background (bounded by 10s and stopped by Close), so a Redis that is down
// at startup delays nothing; its findings go to cfg.Logger.
//
// Set ContextTimeoutEnabled on the client's options so that the deadlines
// of the contexts handed to the store (the middleware's StoreTimeout) bound
// every call; without it go-redis bounds calls by its ReadTimeout and
// WriteTimeout only. (With batching, a call waiting on a pipeline returns
// at its own deadline either way; a call sent on its own, and the
// pipeline itself, rely on the client for theirs.)
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: client is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := checkWaitClient(client, cfg); err != nil {
		return nil, err
	}
	s := &Store{
		client:    client,
		cfg:       cfg,
		sharded:   isSharded(client) && !hasHashTag(cfg.Prefix),
		checkDone: make(chan struct{}),
		closeD:    make(chan struct{}),
	}
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	if !cfg.Batch.Disabled && !s.sharded {
		s.lane0 = s.newLane()
	}
	ctx, cancel := context.WithTimeout(context.Background(), serverCheckTimeout)
	s.cancel = cancel
	if cfg.SkipServerCheck {
		close(s.checkDone)
		return s, nil
	}
	go func() {
		defer close(s.checkDone)
		err := s.CheckServer(ctx)
		if err != nil && !errors.Is(err, ErrEvictionPolicy) && !errors.Is(err, ErrDataLimit) && !errors.Is(err, ErrTooFewReplicas) && ctx.Err() == nil {
			// CheckServer logged eviction itself; this is "could not ask".
			s.cfg.Logger.Info("redisstore: could not check that the server's maxmemory-policy is noeviction", watermill.LogFields{
				"err":    err.Error(),
				"advice": "make sure maxmemory-policy is noeviction",
			})
		}
	}()
	return s, nil
}

// isSharded reports whether client spreads keys over several nodes. Only a
// plain *redis.Client (one node, or a Sentinel-managed primary) runs a
// multi-key script as it is; any other UniversalClient gets the one-key-per-
// script path, which is correct everywhere.
func isSharded(client redis.UniversalClient) bool {
	_, single := client.(*redis.Client)
	return !single
}

// waiting reports whether writes wait for replicas.
func (s *Store) waiting() bool { return s.cfg.WaitReplicas > 0 }

// classify puts err, the error of a call whose context the caller does
// not pass, in its class (see the function classify).
func (s *Store) classify(err error) error { return classify(s.client, err) }

// classifyCall puts err, the error of a call made under ctx, in its
// class (see the function classifyCall).
func (s *Store) classifyCall(ctx context.Context, err error) error {
	return classifyCall(ctx, s.client, err)
}

// layout is the key layout of the store's Config (keys.go).
func (s *Store) layout() keyLayout {
	return keyLayout{prefix: s.cfg.Prefix, compact: s.cfg.CompactKeys, digestOver: s.cfg.DigestKeysLongerThan}
}

// encodeKey returns the Redis key of (scope, key) (see keyLayout.encodeKey).
func (s *Store) encodeKey(scope, key string) string { return s.layout().encodeKey(scope, key) }

// decodeKey returns the (scope, key) of a Redis key, as far as the layout
// keeps them (see keyLayout.decodeKey).
func (s *Store) decodeKey(rkey string) (scope, key string, scopeOK, keyOK bool) {
	return s.layout().decodeKey(rkey)
}

// digests reports whether key is stored as a digest under the config.
func (s *Store) digests(key string) bool { return s.layout().digests(key) }

// matchPattern is the SCAN MATCH pattern of the store's records, or of
// the records of one scope (see keyLayout.matchPattern).
func (s *Store) matchPattern(scope string, byScope bool) string {
	return s.layout().matchPattern(scope, byScope)
}

// recordKeys validates scope and keys and returns the distinct Redis keys
// of the claim, in the order of their first occurrence. A key longer than
// MaxKeyLen is refused unless it is stored as a digest (CompactKeys,
// DigestKeysLongerThan).
func (s *Store) recordKeys(scope string, keys []string) ([]string, error) {
	if err := storekit.CheckKeys(keys); err != nil {
		return nil, err
	}
	if err := s.Capabilities().CheckScope(scope); err != nil {
		return nil, err
	}
	for i, k := range keys {
		if len(k) > s.cfg.MaxKeyLen && !s.cfg.CompactKeys && !s.digests(k) {
			return nil, fmt.Errorf("%w: key %d is %d bytes, longer than MaxKeyLen (%d)",
				stores.ErrInvalidKey, i, len(k), s.cfg.MaxKeyLen)
		}
	}
	rkeys := make([]string, 0, len(keys))
	for _, k := range keys {
		rk := s.encodeKey(scope, k)
		dup := false
		for _, seen := range rkeys {
			if seen == rk {
				dup = true
				break
			}
		}
		if !dup {
			rkeys = append(rkeys, rk)
		}
	}
	return rkeys, nil
}

// Capabilities implements [stores.Store]: scopes of at most MaxKeyLen
// bytes, and keys too unless they are stored as digests (CompactKeys,
// DigestKeysLongerThan); data up to Config.MaxData; the Admin interface.
func (s *Store) Capabilities() stores.Capabilities {
	c := stores.Capabilities{Kind: "redisstore", MaxScope: s.cfg.MaxKeyLen, MaxKey: s.cfg.MaxKeyLen, MaxData: s.cfg.MaxData, Admin: true, Owners: true}
	if s.cfg.CompactKeys || s.cfg.DigestKeysLongerThan > 0 {
		c.MaxKey = 0
	}
	return c
}

// Close stops the background server check, if still running, and waits
// for it; for each node's batcher, which sends the calls still queued and
// waits for its pipelines out and its undos of claims whose callers gave
// up (bounded by 2s each); and for the give-backs of failed claims and
// put-backs of fenced calls (bounded by the lease, or the TTLs put back,
// 2s at least). When ctx ends first it returns ctx's error and cancels
// the give-backs and put-backs under way, leaving their keys to their
// leases; it does not stop the batchers, whose pipelines and undos run to
// their own bounds. Every later call returns [stores.ErrClosed]; calls
// already under way finish, but what they would undo after Close is left
// to its lease. It never closes the client. It is idempotent.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
		go func() {
			<-s.checkDone
			s.closeLanes()
			s.bgMu.Lock()
			s.bgClosed = true
			s.bgMu.Unlock()
			s.bg.Wait()
			s.bgStop()
			close(s.closeD)
		}()
	})
	select {
	case <-s.closeD:
		return nil
	case <-ctx.Done():
		s.bgStop()
		return ctx.Err()
	}
}

// background runs f in a goroutine of its own, under a context that ends
// after timeout or when a Close gives up waiting for it, and returns a
// channel closed once f has returned; nil, without running f, once Close
// waits for the background work.
func (s *Store) background(timeout time.Duration, f func(ctx context.Context)) <-chan struct{} {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return nil
	}
	s.bg.Add(1)
	done := make(chan struct{})
	go func() {
		defer s.bg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(s.bgCtx, timeout)
		defer cancel()
		f(ctx)
	}()
	return done
}

// waitWhile waits until done is closed (nil: at once) or ctx ends.
func waitWhile(ctx context.Context, done <-chan struct{}) {
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}
