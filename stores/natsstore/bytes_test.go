package natsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestBytesPerRecord measures what the README states: the bytes the
// stream of a bucket reports (State.Bytes, which nats-server counts per
// stored message: subject, headers, body and its own framing) divided
// by the records in it, for done records of message-id keys (UUIDs)
// with no data, and for processing records, in a bucket whose name is as
// long as the default's. Neither depends on the scope or the key: each
// record is a fixed-length digest.
func TestBytesPerRecord(t *testing.T) {
	nc := sharedConn(t)
	const n = 1000
	for _, tc := range []struct {
		name     string
		complete bool
		max      float64 // what the README states, with a margin
	}{
		{"done", true, 143},
		{"processing", false, 160},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A bucket name as long as the default, "dedup": the subject
			// of every record holds it.
			cfg := natsstore.Config{Bucket: "b" + storetest.NewID()[:4]}
			s := newStore(t, nc, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range n {
				c, err := s.Claim(ctx, "orders-handler", []string{watermill.NewUUID()}, time.Minute)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim = %+v, %v", c, err)
				}
				if tc.complete {
					if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != n {
				t.Fatalf("%d messages in the stream, want %d (one per record)", info.State.Msgs, n)
			}
			per := float64(info.State.Bytes) / float64(info.State.Msgs)
			t.Logf("%s: %d records, %d stream bytes: %.1f bytes a record", tc.name, info.State.Msgs, info.State.Bytes, per)
			if per > tc.max {
				t.Errorf("%.1f bytes a %s record, the README says at most %.0f", per, tc.name, tc.max)
			}
		})
	}
}
