package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// A multi-key claim (the claim script) that succeeds in a pipeline for a
// caller who has already given up is given back in the background, as a
// single-key one is: its keys are free again long before the lease.
func TestBatchOrphanedMultiKeyClaimIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := sharedRedis(t)
	s, h := hookedStore(t, client, redisstore.Config{Batch: redisstore.BatchConfig{MaxInFlight: 1}})
	stays := orphanMultiKeyClaim(t, s, h)
	r := <-stays
	if r.err != nil {
		t.Error(r.err)
	}
	if r.c == nil || r.c.Result != stores.Claimed {
		t.Fatalf("Claim(stays) = %v: a caller leaving failed the pipeline", r.c)
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
	leftKey := s.EncodeKey("h", "left-a")

	// An hour's lease, aged past its end: its record is kept for most of
	// another hour, however slow the rest of the test runs.
	const lease = time.Hour
	prev, err := s.Claim(ctx, "h", []string{"left-a"}, lease)
	if err != nil || prev.Result != stores.Claimed {
		t.Fatalf("Claim(left-a) = %+v, %v", prev, err)
	}
	age(t, client, lease+time.Second, leftKey) // prev's lease ran out; nobody took it over yet

	stays := orphanMultiKeyClaim(t, s, h) // it takes left-a over, for nobody
	if r := <-stays; r.err != nil {
		t.Fatal(r.err)
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

// claimResult is what a Claim returned.
type claimResult struct {
	c   *stores.Claim
	err error
}

// orphanMultiKeyClaim makes a claim of "left-a" and "left-b" (scope "h")
// that s runs for nobody: behind a claim of "stuck" that holds the
// store's only slot, it queues that claim and one of "stays" after it,
// so the two share a pipeline; it ends the first caller's context while
// the hook holds that pipeline, checks the caller got context.Canceled,
// and lets the pipeline go. It returns what the claim of "stays" gets.
func orphanMultiKeyClaim(t *testing.T, s *redisstore.Store, h *cmdHook) <-chan claimResult {
	t.Helper()
	ctx := context.Background()
	heldStuck, releaseStuck := holdKey(s, h, "stuck")
	stuck := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, "h", []string{"stuck"}, time.Minute); stuck <- err }()
	<-heldStuck // the only slot is taken

	heldLeft, releaseLeft := holdKey(s, h, "left-a")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	left := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, "h", []string{"left-a", "left-b"}, time.Minute); left <- err }()
	waitFor(t, 5*time.Second, "the multi-key claim to queue", func() bool { return testkit.WaitingInBatcher() == 1 })
	stays := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(ctx, "h", []string{"stays"}, time.Minute)
		stays <- claimResult{c, err}
	}()
	waitFor(t, 5*time.Second, "both claims to queue", func() bool { return testkit.WaitingInBatcher() == 2 })

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
	return stays
}
