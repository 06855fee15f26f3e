package natsstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// connect returns a connection to url, closed when the test ends.
func connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)...)
	if err != nil {
		testkit.Unavailable(t, "NATS", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// sharedConn returns a connection to the test NATS server (NATS_URL or
// nats://127.0.0.1:4222); when none answers, the test fails naming it (see
// testkit.Unavailable).
func sharedConn(t testing.TB) *nats.Conn {
	t.Helper()
	return connect(t, testkit.RequireNATS(t))
}

// currentConn starts a nats-server of the current release for the test
// (per-message TTLs: the store's TTLPerKey) and returns a connection to
// it; both end with the test.
func currentConn(t testing.TB) *nats.Conn {
	t.Helper()
	return connect(t, natstest.CurrentNATS(t).Start(t, "").URL())
}

// onServers runs f in a subtest on each server the store is tested on:
// "shared", the server of NATS_URL (Debian's nats-server 2.9.10 on
// 127.0.0.1:4222: no per-message TTLs, the buckets' MaxAge), and
// "current", one of natstest.CurrentNATSVersion started for the subtest
// (per-key TTLs).
func onServers(t *testing.T, f func(t *testing.T, nc *nats.Conn)) {
	t.Run("shared", func(t *testing.T) { f(t, sharedConn(t)) })
	t.Run("current", func(t *testing.T) { f(t, currentConn(t)) })
}

// onURLs is onServers for a test that makes its own connections: f gets
// the server's URL.
func onURLs(t *testing.T, f func(t *testing.T, url string)) {
	t.Run("shared", func(t *testing.T) { f(t, testkit.RequireNATS(t)) })
	t.Run("current", func(t *testing.T) { f(t, natstest.CurrentNATS(t).Start(t, "").URL()) })
}

// expectedMode is the TTLMode New picks for cfg on nc when none of
// cfg's buckets exists.
func expectedMode(nc *nats.Conn, cfg natsstore.Config) natsstore.TTLMode {
	if _, level := nc.ConnectedServerJetStream(); level >= 1 && cfg.TTLMode != natsstore.TTLBucket {
		return natsstore.TTLPerKey
	}
	return natsstore.TTLBucket
}

// testBucket returns a bucket name no other test uses.
func testBucket() string { return "test_" + storetest.NewID() }

// deleteBuckets deletes the buckets of cfg when the test ends.
func deleteBuckets(t testing.TB, nc *nats.Conn, cfg natsstore.Config) {
	t.Helper()
	t.Cleanup(func() {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, b := range cfg.Buckets() {
			if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				t.Errorf("cleanup: delete bucket %s: %v", b, err)
			}
		}
	})
}

// newStore returns a store on nc in a bucket of its own (unless cfg
// names one), deleted and closed when the test ends. A store in buckets
// of its own must expire its records by per-key TTLs on a server that
// has them, else by the buckets' MaxAge.
func newStore(t testing.TB, nc *nats.Conn, cfg natsstore.Config) *natsstore.Store {
	t.Helper()
	fresh := cfg.Bucket == ""
	if fresh {
		cfg.Bucket = testBucket()
	}
	deleteBuckets(t, nc, cfg)
	s := openStore(t, nc, cfg)
	if want := expectedMode(nc, cfg); fresh && s.TTLMode() != want {
		t.Fatalf("a store in new buckets on nats-server %s expires records by %s, want %s", nc.ConnectedServerVersion(), s.TTLMode(), want)
	}
	return s
}

// openStore opens a store on nc with cfg, its bucket as it stands (a
// restricted user's connection may not create it), closed when t ends.
func openStore(t testing.TB, nc *nats.Conn, cfg natsstore.Config) *natsstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := natsstore.New(ctx, nc, cfg)
	if err != nil {
		t.Fatalf("natsstore.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// factory makes stores with cfg and the suite's clock, each in a bucket
// of its own.
func factory(nc *nats.Conn, cfg natsstore.Config) storetest.Factory {
	return func(t *testing.T, clock stores.Clock) stores.Store {
		c := cfg
		c.Clock = clock
		return newStore(t, nc, c)
	}
}

// streamMsgs is the number of messages in the stream of bucket.
func streamMsgs(t testing.TB, nc *nats.Conn, bucket string) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatalf("stream of %s: %v", bucket, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream info of %s: %v", bucket, err)
	}
	return info.State.Msgs
}

// freshBucket returns the config of a bucket name no other test uses on nc
// (deleted after the test) and a JetStream context on nc, for a test that
// creates the bucket itself.
func freshBucket(t *testing.T, nc *nats.Conn) (natsstore.Config, jetstream.JetStream) {
	t.Helper()
	cfg := natsstore.Config{Bucket: testBucket()}
	deleteBuckets(t, nc, cfg)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, js
}

// bucketLike returns the KV config of cfg's bucket as the store would
// create it on nc, History and the other settings left to the caller:
// per-message TTLs and no MaxAge where the server has them (TTLPerKey),
// else the MaxAge the config needs (TTLBucket).
func bucketLike(nc *nats.Conn, cfg natsstore.Config) jetstream.KeyValueConfig {
	if expectedMode(nc, cfg) == natsstore.TTLPerKey {
		return jetstream.KeyValueConfig{Bucket: cfg.Bucket, LimitMarkerTTL: time.Minute}
	}
	return jetstream.KeyValueConfig{Bucket: cfg.Bucket, TTL: cfg.RequiredMaxAge()}
}

// onBinaries runs f in a subtest on each nats-server binary the store is
// tested on: "debian", the system's (2.9.10), and "current",
// natstest.CurrentNATSVersion; f starts the servers it needs with bin.
func onBinaries(t *testing.T, f func(t *testing.T, bin natstest.NATSBin)) {
	t.Run("debian", func(t *testing.T) { f(t, natstest.SystemNATS(t)) })
	t.Run("current", func(t *testing.T) { f(t, natstest.CurrentNATS(t)) })
}
