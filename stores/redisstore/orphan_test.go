package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// waitingInBatcher reports how many goroutines wait in a Batcher's Do for
// a result: calls queued behind a busy slot, or out in a worker's batch.
func waitingInBatcher() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	waiting := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, rest, _ := bytes.Cut(g, []byte("\n"))
		if bytes.Contains(header, []byte("[select")) && bytes.HasPrefix(rest, []byte("github.com/watermill-dedup/dedup/stores/internal/batch.(*Batcher[")) {
			waiting++
		}
	}
	return waiting
}

// A multi-key claim (the claim script) that succeeds in a pipeline for a
// caller who has already given up is given back in the background, as a
// single-key one is: its keys are free again long before the lease.
func TestBatchOrphanedMultiKeyClaimIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	s, h := hookedStore(t, client, redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}})
	stuckKey, leftKey := s.EncodeKey("h", "stuck"), s.EncodeKey("h", "left-a")

	// The gate holds the first command batch with "stuck", then the first
	// with "left-a", each until its release is closed.
	heldStuck, releaseStuck := make(chan struct{}), make(chan struct{})
	heldLeft, releaseLeft := make(chan struct{}), make(chan struct{})
	var onceStuck, onceLeft sync.Once
	h.setGate(func(keys []string) {
		for _, k := range keys {
			switch k {
			case stuckKey:
				onceStuck.Do(func() { close(heldStuck); <-releaseStuck })
			case leftKey:
				onceLeft.Do(func() { close(heldLeft); <-releaseLeft })
			}
		}
	})

	stuck := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
	<-heldStuck // the only slot is taken

	// Two calls queue behind it and will share a pipeline: a multi-key
	// claim whose caller leaves while the pipeline is held, and one who
	// stays.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	left := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, "h", []string{"left-a", "left-b"}, time.Minute); left <- err }()
	waitFor(t, 5*time.Second, "the multi-key claim to queue", func() bool { return waitingInBatcher() == 1 })
	stays := make(chan *stores.Claim, 1)
	go func() {
		c, err := s.Claim(ctx, "h", []string{"stays"}, time.Minute)
		if err != nil {
			t.Error(err)
		}
		stays <- c
	}()
	waitFor(t, 5*time.Second, "both claims to queue", func() bool { return waitingInBatcher() == 2 })

	close(releaseStuck)
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	<-heldLeft // the pipeline of both is held
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim(left-a, left-b) = %v, want context.Canceled", err)
	}
	close(releaseLeft) // the pipeline goes out: both keys are claimed for nobody
	if c := <-stays; c == nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(stays) = %v: a caller leaving failed the pipeline", c)
	}
	if _, pipelines, _, _ := h.counts(); pipelines == 0 {
		t.Fatal("the two queued claims did not share a pipeline")
	}
	waitFor(t, 5*time.Second, "the orphaned multi-key claim to be given back", func() bool {
		c, err := s.Claim(ctx, "h", []string{"left-b", "left-a"}, time.Minute)
		return err == nil && c.Result == stores.Claimed
	})
}

// An orphaned multi-key claim that took over an expired lease gives that
// record back to its owner, on the key it was taken from: the previous
// owner, whose lease ended less than a lease ago, can still complete.
func TestBatchOrphanedTakeoverIsPutBack(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	s, h := hookedStore(t, client, redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}})
	stuckKey, leftKey := s.EncodeKey("h", "stuck"), s.EncodeKey("h", "left-a")

	// An hour's lease, aged past its end: its record is kept for most of
	// another hour, however slow the rest of the test runs.
	const lease = time.Hour
	prev, err := s.Claim(ctx, "h", []string{"left-a"}, lease)
	if err != nil || prev.Result != stores.Claimed {
		t.Fatalf("Claim(left-a) = %+v, %v", prev, err)
	}
	age(t, client, lease+time.Second, leftKey) // prev's lease ran out; nobody took it over yet

	heldStuck, releaseStuck := make(chan struct{}), make(chan struct{})
	heldLeft, releaseLeft := make(chan struct{}), make(chan struct{})
	var onceStuck, onceLeft sync.Once
	h.setGate(func(keys []string) {
		for _, k := range keys {
			switch k {
			case stuckKey:
				onceStuck.Do(func() { close(heldStuck); <-releaseStuck })
			case leftKey:
				onceLeft.Do(func() { close(heldLeft); <-releaseLeft })
			}
		}
	})
	stuck := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
	<-heldStuck

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	left := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, "h", []string{"left-a", "left-b"}, time.Minute); left <- err }()
	waitFor(t, 5*time.Second, "the multi-key claim to queue", func() bool { return waitingInBatcher() == 1 })
	stays := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, "h", []string{"stays"}, time.Minute); stays <- err }()
	waitFor(t, 5*time.Second, "both claims to queue", func() bool { return waitingInBatcher() == 2 })

	close(releaseStuck)
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	<-heldLeft
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim(left-a, left-b) = %v, want context.Canceled", err)
	}
	close(releaseLeft) // the claim takes left-a over, for nobody
	if err := <-stays; err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the orphaned claim to give left-b back", func() bool {
		c, err := s.Claim(ctx, "h", []string{"left-b"}, time.Minute)
		return err == nil && c.Result == stores.Claimed
	})
	// left-a is put back to the previous owner's record by a give-back of
	// its own, on its node, which may still be under way: a Complete
	// before it fails with ErrLostClaim and writes nothing.
	var err2 error
	waitFor(t, time.Minute, "the previous owner's Complete after the orphaned takeover was undone", func() bool {
		err2 = s.Complete(ctx, prev, time.Hour, nil)
		return err2 == nil || !errors.Is(err2, stores.ErrLostClaim)
	})
	if err2 != nil {
		t.Fatalf("the previous owner's Complete after the orphaned takeover was undone = %v", err2)
	}
}
