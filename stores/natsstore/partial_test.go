package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// TestCompleteCutBetweenKeys: a Complete of two keys whose connection is
// cut between its two writes leaves one key done and the other processing
// under the claim. Its retry (the middleware retries a Complete failed by
// an outage) must finish the job: complete the key still processing, so
// the message's keys are all done — else that key stays processing, nobody
// extends it, and after its lease a producer retry under a new message id
// (the same business key) takes it over and runs the effect again.
func TestCompleteCutBetweenKeys(t *testing.T) {
	s, p, nc, _ := proxied(t, natsstore.Config{})
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
}

// TestBucketLimits: an existing bucket whose stream would drop records
// to stay under a limit (discard-old) is refused, since done records
// would vanish before their retention; a bucket that refuses writes when
// full (discard-new) is accepted, and a claim it refuses is not reported
// as an outage, which a fail-open consumer would run through.
func TestBucketLimits(t *testing.T) {
	nc := sharedConn(t)
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
}
