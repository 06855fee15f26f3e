package natsstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

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
	nc := sharedConn(t)
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
}
