package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// orderedKeys returns two keys of scope whose records s writes in the
// order first, second.
func orderedKeys(s *natsstore.Store, scope string) (first, second string) {
	for i := 0; ; i++ {
		a, b := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		if s.Subject(scope, a) < s.Subject(scope, b) {
			return a, b
		}
	}
}

// twoStores returns two stores sharing a bucket and a fake clock: two
// consumer processes.
func twoStores(t *testing.T, nc *nats.Conn) (s, other *natsstore.Store, clock *storetest.FakeClock) {
	clock = storetest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	cfg := natsstore.Config{Bucket: testBucket(), Clock: clock}
	return newStore(t, nc, cfg), newStore(t, nc, cfg), clock
}

func claim(t *testing.T, s stores.Store, scope string, lease time.Duration, keys ...string) *stores.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), scope, keys, lease)
	if err != nil {
		t.Fatalf("Claim(%q): %v", keys, err)
	}
	return c
}

func mustResult(t *testing.T, c *stores.Claim, want stores.Result, takeover bool) {
	t.Helper()
	if c.Result != want || c.Takeover != takeover {
		t.Fatalf("Claim(%q) = %s takeover=%v, want %s takeover=%v", c.Keys, c.Result, c.Takeover, want, takeover)
	}
}

// TestClaimGivesBackOnConflict: a multi-key claim that finds its second
// key taken between its read and its write gives the first back and
// answers InProgress; the first key is free at once, not held until a
// lease runs out.
func TestClaimGivesBackOnConflict(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s, other, _ := twoStores(t, nc)
		const scope = "h"
		k1, k2 := orderedKeys(s, scope)
		var rival *stores.Claim
		s.SetAfterWrite(func(op string, i int) {
			if op == "claim" && i == 0 && rival == nil {
				rival = claim(t, other, scope, time.Minute, k2)
				mustResult(t, rival, stores.Claimed, false)
			}
		})
		c := claim(t, s, scope, time.Minute, k1, k2)
		mustResult(t, c, stores.InProgress, false)
		if c.Token != "" {
			t.Fatalf("InProgress with token %q", c.Token)
		}
		s.SetAfterWrite(nil)
		c1 := claim(t, other, scope, time.Minute, k1)
		mustResult(t, c1, stores.Claimed, false)
		mustResult(t, claim(t, other, scope, time.Minute, k2), stores.InProgress, false)
	})
}

// TestClaimRetriesAfterRelease: a key claimed and released by another
// process between a claim's read and its write has a new revision, so
// the write fails; the claim gives back what it took, reads again, finds
// the key free and takes every key, instead of answering InProgress.
func TestClaimRetriesAfterRelease(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s, other, _ := twoStores(t, nc)
		const scope = "h"
		k1, k2 := orderedKeys(s, scope)
		rounds := 0
		s.SetAfterWrite(func(op string, i int) {
			rounds++
			if rounds == 1 {
				c := claim(t, other, scope, time.Minute, k2)
				mustResult(t, c, stores.Claimed, false)
				if err := other.Release(context.Background(), c); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
		c := claim(t, s, scope, time.Minute, k1, k2)
		mustResult(t, c, stores.Claimed, false)
		if rounds != 2 {
			t.Fatalf("the claim took %d rounds, want 2", rounds)
		}
		s.SetAfterWrite(nil)
		mustResult(t, claim(t, other, scope, time.Minute, k1), stores.InProgress, false)
		mustResult(t, claim(t, other, scope, time.Minute, k2), stores.InProgress, false)
	})
}

// TestClaimGiveBackRestoresTakenOverLease: a multi-key claim that took
// over an expired lease and then lost its second key puts the old
// owner's record back: the old owner still owns its key and completes.
func TestClaimGiveBackRestoresTakenOverLease(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s, other, clock := twoStores(t, nc)
		const scope = "h"
		k1, k2 := orderedKeys(s, scope)
		old := claim(t, other, scope, time.Second, k1)
		mustResult(t, old, stores.Claimed, false)
		clock.Advance(1500 * time.Millisecond)
		s.SetAfterWrite(func(op string, i int) {
			if op == "claim" && i == 0 {
				mustResult(t, claim(t, other, scope, time.Minute, k2), stores.Claimed, false)
			}
		})
		mustResult(t, claim(t, s, scope, time.Minute, k1, k2), stores.InProgress, false)
		s.SetAfterWrite(nil)
		if err := other.Complete(context.Background(), old, time.Hour, []byte("old")); err != nil {
			t.Fatalf("Complete by the owner of the lease the failed claim took over: %v", err)
		}
		d := claim(t, s, scope, time.Minute, k1)
		mustResult(t, d, stores.Duplicate, false)
		if string(d.Data) != "old" {
			t.Fatalf("Data = %q", d.Data)
		}
	})
}

// TestFencedCallPutsBack: a Complete, Release or Extend of two keys
// whose second key is taken over between its writes fails with
// ErrLostClaim and puts the first key back to the claim's record.
func TestFencedCallPutsBack(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		for _, op := range []string{"complete", "release", "extend"} {
			t.Run(op, func(t *testing.T) {
				s, other, clock := twoStores(t, nc)
				const scope = "h"
				k1, k2 := orderedKeys(s, scope)
				c := claim(t, s, scope, time.Second, k1, k2)
				mustResult(t, c, stores.Claimed, false)
				clock.Advance(1500 * time.Millisecond) // the lease ran out; still the claim's
				s.SetAfterWrite(func(o string, i int) {
					if o == op && i == 0 {
						mustResult(t, claim(t, other, scope, time.Minute, k2), stores.Claimed, true)
					}
				})
				ctx := context.Background()
				var err error
				switch op {
				case "complete":
					err = s.Complete(ctx, c, time.Hour, []byte("x"))
				case "release":
					err = s.Release(ctx, c)
				default:
					err = s.Extend(ctx, c, time.Minute)
				}
				errtest.Wraps(t, op+" of a claim whose key was taken over", err, stores.ErrLostClaim)
				s.SetAfterWrite(nil)
				// k1 is the claim's expired lease again: a claim takes it
				// over (it is neither done, nor free, nor leased anew).
				mustResult(t, claim(t, other, scope, time.Minute, k1), stores.Claimed, true)
			})
		}
	})
}

// TestUndoLeavesWithTheCaller: a Claim whose write failed as an outage
// gives back what that write may have left (reading the key first, its
// outcome unknown), but only while the caller's context lasts: when the
// context ends during the give-back, the Claim returns at once, and the
// give-back goes on in the background. (A JetStream stream without a
// leader answers the write with no responders and never answers the
// read: the Claim outlived its context by the give-back's own 2s.)
//
// Here the bucket's stream is deleted, so the write gets no responders,
// and the test holds the direct get of the give-back, unanswered.
func TestUndoLeavesWithTheCaller(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg := natsstore.Config{Bucket: testBucket()}
		s := newStore(t, nc, cfg)
		held := make(chan *nats.Msg, 16)
		sub, err := nc.ChanSubscribe("$JS.API.DIRECT.GET.KV_"+cfg.Bucket+".>", held)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteKeyValue(context.Background(), cfg.Bucket); err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		res := make(chan error, 1)
		go func() {
			_, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
			res <- err
		}()
		select {
		case <-held: // the give-back reads the key
		case err := <-res:
			t.Fatalf("Claim returned %v before giving back its write", err)
		}
		cancel()
		select {
		case err := <-res:
			errtest.Wraps(t, "Claim whose context ended during its give-back", err, context.Canceled)
			if errors.Is(err, stores.ErrUnavailable) {
				t.Errorf("Claim whose context ended: err = %v is classified as an outage", err)
			}
		case <-time.After(time.Second):
			t.Fatal("Claim still running 1s after its context ended: its give-back outlived the caller")
		}
		// The give-back goes on without the caller: it reads the key again.
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("the give-back did not go on in the background")
		}
	})
}

// TestCompleteCutBetweenKeys: a Complete of two keys whose connection is
// cut between its two writes leaves one key done and the other processing
// under the claim. Its retry (the middleware retries a Complete failed by
// an outage) must finish the job: complete the key still processing, so
// the message's keys are all done — else that key stays processing, nobody
// extends it, and after its lease a producer retry under a new message id
// (the same business key) takes it over and runs the effect again.
func TestCompleteCutBetweenKeys(t *testing.T) {
	onServers(t, func(t *testing.T, direct *nats.Conn) {
		s, p, nc, _ := proxied(t, direct, natsstore.Config{})
		bg := context.Background()
		const scope = "loyalty"
		// Keys in both write orders: the cut lands after the first written.
		for _, keys := range [][]string{{"msg:1", "payment:a"}, {"payment:b", "msg:2"}} {
			c, err := s.Claim(bg, scope, keys, time.Minute)
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("claim %q: %v %v", keys, c, err)
			}
			s.SetAfterWrite(func(op string, i int) {
				if op == "complete" {
					p.Cut()
				}
			})
			err = s.Complete(bg, c, time.Hour, []byte("outputs"))
			s.SetAfterWrite(nil)
			if !errors.Is(err, stores.ErrUnavailable) {
				t.Fatalf("Complete during the cut: %v, want ErrUnavailable", err)
			}
			restore(t, p, nc)
			// The second write may have landed before the cut was seen (an
			// unknown outcome): then the retry finds the claim completed and
			// says so, as a second Complete does.
			if err := s.Complete(bg, c, time.Hour, []byte("outputs")); err != nil && !errors.Is(err, stores.ErrLostClaim) {
				t.Fatalf("the retry of a Complete cut between its keys: %v, want it to complete the rest", err)
			}
			for _, k := range keys {
				got, err := s.Claim(bg, scope, []string{k}, time.Minute)
				if err != nil || got.Result != stores.Duplicate || string(got.Data) != "outputs" {
					t.Fatalf("key %q after the retried Complete: %+v %v, want a duplicate with the data", k, got, err)
				}
			}
			// A Complete of a claim already done stays refused.
			if err := s.Complete(bg, c, time.Hour, nil); !errors.Is(err, stores.ErrLostClaim) {
				t.Fatalf("a third Complete: %v, want ErrLostClaim", err)
			}
		}
	})
}

// TestBucketLimits: an existing bucket whose stream would drop records
// to stay under a limit (discard-old) is refused, since done records
// would vanish before their retention; a bucket that refuses writes when
// full (discard-new) is accepted, and a claim it refuses is not reported
// as an outage, which a fail-open consumer would run through.
func TestBucketLimits(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		for _, discard := range []jetstream.DiscardPolicy{jetstream.DiscardOld, jetstream.DiscardNew} {
			cfg := natsstore.Config{Bucket: testBucket()}
			deleteBuckets(t, nc, cfg)
			if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Bucket, History: 1, TTL: 72 * time.Hour}); err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			sc := st.CachedInfo().Config
			sc.MaxMsgs, sc.Discard = 2, discard
			if _, err := js.UpdateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			s, err := natsstore.New(ctx, nc, cfg)
			if discard == jetstream.DiscardOld {
				if !errors.Is(err, natsstore.ErrBucketConfig) {
					t.Fatalf("a discard-old bucket with MaxMsgs: New = %v, want ErrBucketConfig", err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("a discard-new bucket: %v", err)
			}
			defer s.Close(ctx)
			var last error
			for i := range 3 {
				_, last = s.Claim(ctx, "s", []string{fmt.Sprint("k", i)}, time.Minute)
			}
			if last == nil || errors.Is(last, stores.ErrUnavailable) {
				t.Fatalf("a claim the full bucket refused: %v, want an error that is not an outage", last)
			}
		}
	})
}
