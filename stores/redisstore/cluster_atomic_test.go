package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestClusterFencedCallsAllOrNothing: in Redis Cluster the keys of a claim
// live on different nodes, and Complete, Release and Extend apply key by
// key after checking every key. A key forgotten between the check and its
// apply (here: a 1ns lease, whose record the server keeps 2ms) fails the
// call with ErrLostClaim; the keys applied before must be put back, so the
// call changes nothing.
func TestClusterFencedCallsAllOrNothing(t *testing.T) {
	cc := startCluster(t)
	s := newStore(t, cc, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}})
	ctx := context.Background()
	lost := 0
	for range 400 {
		keys := keysOnDistinctNodes(t, cc, s, "s", 3)
		c, err := s.Claim(ctx, "s", keys, time.Nanosecond)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(%q) = %+v, %v", keys, c, err)
		}
		time.Sleep(1700*time.Microsecond + rand.N(600*time.Microsecond))
		extendErr := s.Extend(ctx, c, time.Hour)
		if extendErr == nil {
			_ = s.Release(ctx, c)
			continue
		}
		if !errors.Is(extendErr, stores.ErrLostClaim) {
			t.Fatalf("Extend: %v", extendErr)
		}
		lost++
		for _, k := range keys {
			ttl, err := cc.PTTL(ctx, s.EncodeKey("s", k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl > time.Minute {
				t.Fatalf("Extend failed with %v, yet key %q is now leased for %s: the call was partly applied", extendErr, k, ttl)
			}
		}
	}
	if lost == 0 {
		t.Skip("no Extend met a forgotten key in 300 tries")
	}
}

// TestClusterClaimUndoKeepsWhatItTookOver: a multi-key claim in Redis
// Cluster that took over an expired lease, then found another key held,
// puts the expired record back, also when its own record (of a 1ns lease,
// kept 2ms) is gone by then: the previous owner, whose lease ended less
// than one lease ago, still owns its record and can Complete it.
func TestClusterClaimUndoKeepsWhatItTookOver(t *testing.T) {
	cc := startCluster(t)
	s := newStore(t, cc, redisstore.Config{Batch: redisstore.BatchConfig{Disabled: true}})
	ctx := context.Background()
	// The previous owner's lease is an hour, run out by ageing its record
	// (see age): its record is kept for most of another hour, however
	// slow the machine, so only the claim under test can take it away.
	const lease = time.Hour
	for try := range 5 {
		keys := keysOnDistinctNodes(t, cc, s, "s", 2)
		a, b := keys[0], keys[1]
		if s.EncodeKey("s", a) > s.EncodeKey("s", b) {
			a, b = b, a // claims take keys in ascending order: A first
		}
		c1, err := s.Claim(ctx, "s", []string{a}, lease)
		if err != nil || c1.Result != stores.Claimed {
			t.Fatal(c1, err)
		}
		if c, err := s.Claim(ctx, "s", []string{b}, time.Hour); err != nil || c.Result != stores.Claimed {
			t.Fatal(c, err)
		}
		age(t, cc, lease+20*time.Millisecond, s.EncodeKey("s", a)) // c1's lease ran out
		// Keep B's node busy for a few ms, so the claim's undo of A comes
		// after its own 1ns record of A expired.
		busy := make(chan struct{})
		go func() {
			defer close(busy)
			_ = spin.Run(ctx, cc, []string{s.EncodeKey("s", b)}, 5).Err()
		}()
		time.Sleep(200 * time.Microsecond)
		c, err := s.Claim(ctx, "s", []string{a, b}, time.Nanosecond)
		<-busy
		if err != nil || c.Result != stores.InProgress {
			t.Fatalf("try %d: Claim(A, B) = %+v, %v; want InProgress (B is held)", try, c, err)
		}
		if err := s.Complete(ctx, c1, time.Hour, nil); err != nil {
			t.Fatalf("try %d: the previous owner's Complete after the failed claim = %v; its record must be put back", try, err)
		}
	}
}

// spin keeps a node busy for ARGV[1] ms.
var spin = redis.NewScript(`
local t = redis.call('TIME')
local until_us = t[1] * 1000000 + t[2] + ARGV[1] * 1000
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] >= until_us
return 0
`)

// cutHook cuts the first write (a script call) on key after it is armed,
// as a failover between the writes of a multi-key Complete would: "again"
// sends it twice (its reply was lost, and go-redis sent it again: the
// second finds the key done), "fail" fails it unsent. It holds the
// script calls on hold other than the claim's (token: a put-back) until
// release is closed, noting the first in held.
type cutHook struct {
	mu        sync.Mutex
	key, hold string
	mode      string
	token     string
	held      chan struct{}
	heldOnce  sync.Once
	release   chan struct{}
}

var errCut = errors.New("cut: the node failed over")

func (h *cutHook) arm(key, hold, token, mode string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.hold, h.token, h.mode = key, hold, token, mode
	h.held, h.heldOnce, h.release = make(chan struct{}), sync.Once{}, make(chan struct{})
}

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.process(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.process(ctx, cmds, next) }
}

func (h *cutHook) process(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
	h.mu.Lock()
	cut, hold := false, false
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); n != "evalsha" && n != "eval" {
			continue
		}
		switch k := cmdKey(c); {
		case k == h.key && h.key != "":
			cut = true
		case k == h.hold && h.hold != "":
			// EVALSHA sha 1 key ARGV[1]...
			hold = len(c.Args()) > 4 && c.Args()[4] != h.token
		}
	}
	key, mode, held, release := h.key, h.mode, h.held, h.release
	if cut {
		h.key, h.mode = "", "" // once
	}
	h.mu.Unlock()
	switch {
	case cut && mode == "fail":
		for _, c := range cmds {
			c.SetErr(errCut)
		}
		return errCut
	case cut && mode == "again":
		err := next(ctx, cmds)
		for _, c := range cmds {
			if cmdKey(c) == key && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				// Not run: the store sends it again with EVAL.
				h.mu.Lock()
				h.key, h.mode = key, mode
				h.mu.Unlock()
				return err
			}
		}
	case hold:
		h.heldOnce.Do(func() { close(held) })
		<-release
	}
	return next(ctx, cmds)
}

// TestClusterCompleteCutPartWay: a Complete of a claim whose keys are on
// two nodes, cut part-way (one key's write lost its reply and was sent
// again, or failed unsent), returns nil only once every key is done;
// otherwise an error that is not ErrLostClaim (the claim lost no key),
// and a retry completes the rest, also while a put-back of the key
// written first is still under way. Then every key is done, with the
// Complete's data: no key is left processing, to be taken over and run
// again after its lease.
func TestClusterCompleteCutPartWay(t *testing.T) {
	addrs := startCluster(t).Options().Addrs
	h := &cutHook{}
	cc := hookedCluster(t, addrs, h)
	for _, mode := range []string{"again", "fail"} {
		for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
			t.Run(fmt.Sprintf("%s/unbatched=%v", mode, batch.Disabled), func(t *testing.T) {
				bg := context.Background()
				s, err := redisstore.New(cc, redisstore.Config{Prefix: testPrefix(t, cc), SkipServerCheck: true, Batch: batch})
				if err != nil {
					t.Fatal(err)
				}
				keys := keysOnDistinctNodes(t, cc, s, "h", 2)
				c, err := s.Claim(bg, "h", keys, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(%q) = %v, %v", keys, c, err)
				}
				h.arm(s.EncodeKey("h", keys[1]), s.EncodeKey("h", keys[0]), c.Token, mode)
				release := closer(t, h.release)
				// The caller waits for a put-back while its context lasts:
				// it ends once one is held.
				ctx, cancel := context.WithCancel(bg)
				stop := make(chan struct{})
				go func() {
					select {
					case <-h.held:
						cancel()
					case <-stop:
					}
				}()
				err = s.Complete(ctx, c, time.Hour, []byte("x"))
				close(stop)
				cancel()
				// The middleware retries a Complete that failed otherwise
				// than with ErrLostClaim.
				for try := 1; err != nil; try++ {
					if errors.Is(err, stores.ErrLostClaim) {
						t.Fatalf("Complete(%q) cut part-way (%s), try %d = %v: the claim lost no key", keys, mode, try, err)
					}
					if try == 3 {
						t.Fatalf("Complete(%q) cut part-way (%s) still fails after %d tries: %v", keys, mode, try, err)
					}
					err = s.Complete(bg, c, time.Hour, []byte("x"))
				}
				release()
				if err := s.Close(bg); err != nil { // waits for the put-backs
					t.Fatal(err)
				}
				check := newStore(t, cc, redisstore.Config{Prefix: s.Prefix()})
				for _, k := range keys {
					if r, err := check.Claim(bg, "h", []string{k}, time.Minute); err != nil || r.Result != stores.Duplicate || string(r.Data) != "x" {
						t.Errorf("Claim(%q) after the Complete returned nil = %v, %v; want duplicate with data %q", k, r, err, "x")
					}
				}
				if err := check.Complete(bg, c, time.Hour, []byte("x")); !errors.Is(err, stores.ErrLostClaim) {
					t.Errorf("Complete of a claim completed already = %v; want ErrLostClaim", err)
				}
			})
		}
	}
}
