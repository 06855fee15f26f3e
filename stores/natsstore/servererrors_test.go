package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// TestServerRestart: while a NATS server of the test's own is down (its
// port closed) every call fails with stores.ErrUnavailable; while it
// starts again (JetStream recovering its streams, the bucket without a
// leader yet) with that, or, once it listens again and before the
// connection is back up, with natsstore.ErrNotConnected (a server that
// answers a new connection: no known outage), and none with another
// class; once it is up the store works again and the claim held across
// the restart completes.
func TestServerRestart(t *testing.T) {
	srv := startNATS(t, "")
	nc := connect(t, srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	s := newStore(t, nc, natsstore.Config{})
	ctx := context.Background()
	held := claim(t, s, "s", time.Minute, "held")

	srv.stop()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := s.Claim(cctx, "s", []string{"down"}, time.Minute)
	cancel()
	errtest.Wraps(t, "Claim while the server is down", err, stores.ErrUnavailable)

	srv.start("")
	var failed []error
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := s.Claim(cctx, "s", []string{fmt.Sprint("after-", i)}, time.Minute)
		cancel()
		if err == nil {
			break
		}
		failed = append(failed, err)
		if len(failed) > 500 {
			t.Fatalf("the store did not work again after the restart: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, err := range failed {
		if !errors.Is(err, stores.ErrUnavailable) && !errors.Is(err, natsstore.ErrNotConnected) {
			t.Errorf("a call during the restart failed with %v, want ErrUnavailable or ErrNotConnected", err)
		}
	}
	t.Logf("%d calls failed as outages during the restart", len(failed))
	if err := s.Complete(ctx, held, time.Hour, []byte("x")); err != nil {
		t.Fatalf("Complete of the claim held across the restart: %v", err)
	}
}
