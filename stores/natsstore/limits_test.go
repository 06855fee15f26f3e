package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// natsServer is a nats-server of a test's own, with JetStream, on a
// loopback port of its own (natstest.StartNATS).
type natsServer struct{ *natstest.NATSServer }

// startNATS starts a nats-server of bin with JetStream and the config
// lines extra (such as "max_payload: 8192"), killed by PID when t ends.
func startNATS(t *testing.T, bin natstest.NATSBin, extra string) *natsServer {
	t.Helper()
	return &natsServer{bin.Start(t, extra)}
}

func (s *natsServer) url() string { return s.URL() }

// start runs the server again with the config lines extra, and waits
// until JetStream answers.
func (s *natsServer) start(extra string) {
	s.SetConfig(extra)
	s.Start()
}

// stop kills the server's process, by its PID, and waits for it.
func (s *natsServer) stop() { s.Kill() }

// TestMaxDataFollowsMaxPayload: on a server with a small max_payload,
// the store states the most data a record keeps in a message of that
// size, keeps exactly that much, and refuses one byte more before any
// I/O. After a reconnect to a server whose max_payload is smaller still,
// data the new server would refuse fails with stores.ErrTooLarge (not an
// outage), and the claim then completes without it.
func TestMaxDataFollowsMaxPayload(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		const payload = 8192
		srv := startNATS(t, bin, "max_payload: "+strconv.Itoa(payload))
		reconnected := make(chan struct{}, 1)
		nc := connect(t, srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
			nats.ReconnectHandler(func(*nats.Conn) {
				select {
				case reconnected <- struct{}{}:
				default:
				}
			}))
		s := newStore(t, nc, natsstore.Config{})
		caps := s.Capabilities()
		if want := payload - 9 - 8 - 128; caps.MaxData != want {
			t.Fatalf("MaxData = %d on a server with max_payload %d, want %d", caps.MaxData, payload, want)
		}
		ctx := context.Background()
		for _, leaderReads := range []bool{false, true} {
			s.SetLeaderReads(leaderReads)
			key := fmt.Sprint("max-", leaderReads)
			c := claim(t, s, "s", time.Minute, key)
			errtest.Wraps(t, "Complete with MaxData+1 bytes", s.Complete(ctx, c, time.Hour, make([]byte, caps.MaxData+1)), stores.ErrTooLarge)
			data := make([]byte, caps.MaxData)
			for i := range data {
				data[i] = byte(i)
			}
			if err := s.Complete(ctx, c, time.Hour, data); err != nil {
				t.Fatalf("Complete with MaxData bytes (leader reads %t): %v", leaderReads, err)
			}
			d := claim(t, s, "s", time.Minute, key)
			if d.Result != stores.Duplicate || string(d.Data) != string(data) {
				t.Fatalf("Claim after Complete (leader reads %t) = %s with %d bytes, want duplicate with %d", leaderReads, d.Result, len(d.Data), len(data))
			}
		}
		s.SetLeaderReads(false)

		// The server comes back with a smaller max_payload.
		c := claim(t, s, "s", time.Minute, "after")
		select {
		case <-reconnected: // none yet, but drain it all the same
		default:
		}
		srv.stop()
		srv.start("max_payload: 4096")
		<-reconnected
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; {
			err = s.Complete(ctx, c, time.Hour, make([]byte, 5000))
			if !errors.Is(err, stores.ErrUnavailable) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // JetStream is still starting
		}
		errtest.NotOutage(t, "Complete with more data than the new max_payload carries", err, stores.ErrTooLarge)
		if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
			t.Fatalf("Complete without data after ErrTooLarge: %v", err)
		}
	})
}

// TestMaxDataFollowsBucket: a bucket whose stream bounds its messages
// (KV MaxValueSize) bounds MaxData; when the bound is lowered after the
// store was built, the stream's refusal is stores.ErrTooLarge, not an
// outage nor unclassified.
func TestMaxDataFollowsBucket(t *testing.T) {
	onServers(t, maxDataFollowsBucket)
}

func maxDataFollowsBucket(t *testing.T, nc *nats.Conn) {
	cfg, js := freshBucket(t, nc)
	ctx := context.Background()
	const maxValue = 1000
	kv := bucketLike(nc, cfg)
	kv.History, kv.MaxValueSize = 1, maxValue
	if _, err := js.CreateKeyValue(ctx, kv); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, nc, cfg)
	if want := expectedMode(nc, cfg); s.TTLMode() != want {
		t.Fatalf("the store expires records by %s in a bucket made as it would make it, want %s", s.TTLMode(), want)
	}
	caps := s.Capabilities()
	if want := maxValue - 9 - 8 - 128; caps.MaxData != want {
		t.Fatalf("MaxData = %d in a bucket with MaxValueSize %d, want %d", caps.MaxData, maxValue, want)
	}
	c := claim(t, s, "s", time.Minute, "a")
	errtest.Wraps(t, "Complete with MaxData+1 bytes", s.Complete(ctx, c, time.Hour, make([]byte, caps.MaxData+1)), stores.ErrTooLarge)
	if err := s.Complete(ctx, c, time.Hour, make([]byte, caps.MaxData)); err != nil {
		t.Fatalf("Complete with MaxData bytes: %v", err)
	}

	// An operator lowers the bound under the running store.
	st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.MaxMsgSize = 300
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	c = claim(t, s, "s", time.Minute, "b")
	errtest.NotOutage(t, "Complete with more data than the stream now keeps", s.Complete(ctx, c, time.Hour, make([]byte, 500)), stores.ErrTooLarge)
	if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
		t.Fatalf("Complete without data after ErrTooLarge: %v", err)
	}
}

// TestBytesPerRecord measures what the README states: the bytes the
// stream of a bucket reports (State.Bytes, which nats-server counts per
// stored message: subject, headers, body and its own framing) divided
// by the records in it, for done records of message-id keys (UUIDs)
// with no data, and for processing records, in a bucket whose name is as
// long as the default's. Neither depends on the scope or the key: each
// record is a fixed-length digest.
func TestBytesPerRecord(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) { bytesPerRecord(t, nc) })
}

// bytesPerRecord writes 1,000 records of each state on nc and checks the
// stream's bytes a record against the README's table for the store's
// TTL mode on that server.
func bytesPerRecord(t *testing.T, nc *nats.Conn) {
	const n = 1000
	for _, tc := range []struct {
		name     string
		complete bool
		// what the README states, with a margin
		max map[natsstore.TTLMode]float64
	}{
		{"done", true, map[natsstore.TTLMode]float64{natsstore.TTLBucket: 143, natsstore.TTLPerKey: 159}},
		{"processing", false, map[natsstore.TTLMode]float64{natsstore.TTLBucket: 160, natsstore.TTLPerKey: 174}},
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
			mode := s.TTLMode()
			t.Logf("%s, %s: %d records, %d stream bytes: %.1f bytes a record", tc.name, mode, info.State.Msgs, info.State.Bytes, per)
			if max, ok := tc.max[mode]; !ok || per > max {
				t.Errorf("%.1f bytes a %s record under %s, the README says at most %.0f", per, tc.name, mode, max)
			}
		})
	}
}
