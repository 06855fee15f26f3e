package natsstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []natsstore.Config{
		{Bucket: "a.b"},
		{Bucket: "a b"},
		{Bucket: "a*"},
		{Shards: -1},
		{Shards: natsstore.MaxShards + 1},
		// Each within its limit, together more than a Duration holds.
		{MaxLease: natsstore.MaxDurationLimit, MaxRetention: natsstore.MaxDurationLimit, ClockSkew: natsstore.MaxDurationLimit},
		{MaxLease: -1},
		{MaxLease: natsstore.MaxDurationLimit + 1},
		{MaxRetention: -time.Second},
		{MaxRetention: math.MaxInt64},
		{ClockSkew: -1},
		{Replicas: -1},
		{Replicas: 6},
		{Storage: 7},
		{TTLMode: -1},
		{TTLMode: natsstore.TTLPerKey + 1},
	} {
		err := cfg.Validate()
		if !errors.Is(err, natsstore.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want an error wrapping ErrInvalidConfig", cfg, err)
			continue
		}
		if _, err := natsstore.New(context.Background(), &nats.Conn{}, cfg); !errors.Is(err, natsstore.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig before any I/O", cfg, err)
		}
		if _, err := natsstore.Connect(context.Background(), "nats://127.0.0.1:1", cfg); !errors.Is(err, natsstore.ErrInvalidConfig) {
			t.Errorf("Connect(%+v) = %v, want ErrInvalidConfig before any I/O", cfg, err)
		}
	}
	for _, cfg := range []natsstore.Config{
		{},
		{Bucket: "Orders_dedup-2", Shards: natsstore.MaxShards, MaxLease: natsstore.MaxDurationLimit,
			MaxRetention: natsstore.MaxDurationLimit, Replicas: 5, Storage: jetstream.MemoryStorage},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", cfg, err)
		}
	}
	if _, err := natsstore.New(context.Background(), nil, natsstore.Config{}); err == nil {
		t.Error("New accepted a nil connection")
	}
}

func TestRequiredMaxAgeAndBuckets(t *testing.T) {
	for _, tc := range []struct {
		cfg  natsstore.Config
		want time.Duration
	}{
		{natsstore.Config{}, 24*time.Hour + time.Minute},
		{natsstore.Config{MaxLease: 13 * time.Hour}, 26*time.Hour + time.Minute},
		{natsstore.Config{MaxLease: time.Minute, MaxRetention: time.Hour, ClockSkew: time.Second}, time.Hour + time.Second},
	} {
		if got := tc.cfg.RequiredMaxAge(); got != tc.want {
			t.Errorf("RequiredMaxAge(%+v) = %s, want %s", tc.cfg, got, tc.want)
		}
	}
	if got := (natsstore.Config{}).Buckets(); len(got) != 1 || got[0] != "dedup" {
		t.Errorf("default Buckets() = %q", got)
	}
	if got := (natsstore.Config{Bucket: "x", Shards: 3}).Buckets(); strings.Join(got, ",") != "x-0,x-1,x-2" {
		t.Errorf("Buckets() of 3 shards = %q", got)
	}
}

// TestBuckets: New creates a missing bucket with the MaxAge the config
// needs, uses an existing one with at least that, and refuses one with
// less, with none, or a stream that is not a KV bucket, changing
// nothing.
func TestBuckets(t *testing.T) {
	nc := sharedConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cfg := natsstore.Config{Bucket: testBucket(), Shards: 2, MaxLease: time.Minute, MaxRetention: time.Hour}
	newStore(t, nc, cfg)
	for _, b := range cfg.Buckets() {
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			t.Fatalf("bucket %s: %v", b, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.TTL() != cfg.RequiredMaxAge() || st.History() != 1 {
			t.Errorf("bucket %s: TTL %s, history %d; want %s and 1", b, st.TTL(), st.History(), cfg.RequiredMaxAge())
		}
	}
	// A second store on the same buckets opens them as they are.
	newStore(t, nc, cfg)

	create := func(ttl time.Duration) string {
		t.Helper()
		name := testBucket()
		deleteBuckets(t, nc, natsstore.Config{Bucket: name})
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	for name, ttl := range map[string]time.Duration{"too short": 24 * time.Hour, "none": 0} {
		b := create(ttl)
		_, err := natsstore.New(ctx, nc, natsstore.Config{Bucket: b})
		if !errors.Is(err, natsstore.ErrBucketConfig) {
			t.Errorf("New on a bucket with MaxAge %s (%s) = %v, want ErrBucketConfig", ttl, name, err)
		}
		kv, _ := js.KeyValue(ctx, b)
		if st, err := kv.Status(ctx); err != nil || st.TTL() != ttl {
			t.Errorf("New changed the bucket's MaxAge to %v (%v)", st.TTL(), err)
		}
	}
	// Longer than needed: used as it is.
	b := create(48 * time.Hour)
	newStore(t, nc, natsstore.Config{Bucket: b})

	// A stream under the KV name that is not a KV bucket.
	name := testBucket()
	deleteBuckets(t, nc, natsstore.Config{Bucket: name})
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KV_" + name, Subjects: []string{"other." + name}, MaxAge: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := natsstore.New(ctx, nc, natsstore.Config{Bucket: name}); !errors.Is(err, natsstore.ErrBucketConfig) {
		t.Errorf("New on a stream that is not a KV bucket = %v, want ErrBucketConfig", err)
	}
}

// TestDurationBounds: a lease or retention past the config's bound is
// refused with ErrInvalidArgument before any I/O; the bound itself is
// valid.
func TestDurationBounds(t *testing.T) {
	nc := sharedConn(t)
	cfg := natsstore.Config{Bucket: testBucket(), MaxLease: time.Minute, MaxRetention: time.Hour}
	s := newStore(t, nc, cfg)
	ctx := context.Background()
	_, err := s.Claim(ctx, "s", []string{"k"}, time.Minute+1)
	errtest.NotOutage(t, "Claim past MaxLease", err, stores.ErrInvalidArgument)
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim at MaxLease = %+v, %v", c, err)
	}
	before := streamMsgs(t, nc, cfg.Bucket)
	errtest.NotOutage(t, "Extend past MaxLease", s.Extend(ctx, c, 2*time.Minute), stores.ErrInvalidArgument)
	errtest.NotOutage(t, "Complete past MaxRetention", s.Complete(ctx, c, time.Hour+1, nil), stores.ErrInvalidArgument)
	errtest.NotOutage(t, "Complete(math.MaxInt64)", s.Complete(ctx, c, math.MaxInt64, nil), stores.ErrInvalidArgument)
	if after := streamMsgs(t, nc, cfg.Bucket); after != before {
		t.Fatalf("refused calls wrote %d messages", after-before)
	}
	if err := s.Extend(ctx, c, time.Minute); err != nil {
		t.Fatalf("Extend at MaxLease: %v", err)
	}
	if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
		t.Fatalf("Complete at MaxRetention: %v", err)
	}
}

// TestLayout pins what a record looks like in the bucket: the key, the
// subject, the value of each state and the marker Release leaves.
func TestLayout(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		clock := storetest.NewFakeClock(time.Unix(1_900_000_000, 123))
		cfg := natsstore.Config{Bucket: testBucket(), Clock: clock}
		s := newStore(t, nc, cfg)
		ctx := context.Background()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}

		const scope, key = "orders", "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"
		// SHA-256("watermill-dedup/natsstore/v1\x00" ‖ uvarint(6) ‖ "orders" ‖ key),
		// first 16 bytes, URL-safe base64 without padding.
		const want = "2kqdZAJOPRyX3r3ylcsQvw"
		if got := natsstore.RecordKey(scope, key); got != want || len(got) != natsstore.KeyLen {
			t.Fatalf("RecordKey = %q, want %q", got, want)
		}
		if got := s.Subject(scope, key); got != "$KV."+cfg.Bucket+"."+want {
			t.Fatalf("Subject = %q", got)
		}
		// With shards, the last 8 bytes of the digest, big endian, modulo
		// the number of shards pick the bucket.
		sharded := natsstore.Config{Bucket: testBucket(), Shards: 3}
		if got := newStore(t, nc, sharded).Subject(scope, key); got != "$KV."+sharded.Bucket+"-1."+want {
			t.Fatalf("Subject with 3 shards = %q, want bucket %s-1", got, sharded.Bucket)
		}
		for _, p := range [][2][2]string{
			{{"a:", "b"}, {"a", ":b"}},
			{{"", "ab"}, {"a", "b"}},
			{{"a\x00", "b"}, {"a", "\x00b"}},
		} {
			if natsstore.RecordKey(p[0][0], p[0][1]) == natsstore.RecordKey(p[1][0], p[1][1]) {
				t.Errorf("(%q, %q) and (%q, %q) share a key", p[0][0], p[0][1], p[1][0], p[1][1])
			}
		}

		value := func() ([]byte, jetstream.KeyValueOp) {
			t.Helper()
			e, err := kv.Get(ctx, want)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, jetstream.KeyValueDelete
			}
			if err != nil {
				t.Fatal(err)
			}
			return e.Value(), e.Operation()
		}
		at := func(d time.Duration) []byte {
			return binary.BigEndian.AppendUint64(nil, uint64(clock.Now().Add(d).UnixNano()))
		}

		c, err := s.Claim(ctx, scope, []string{key}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		v, _ := value()
		if wantV := append(append([]byte{'p'}, at(time.Minute)...), c.Token...); !bytes.Equal(v, wantV) {
			t.Fatalf("processing value = %q, want %q", v, wantV)
		}
		if len(c.Token) != 26 {
			t.Fatalf("token %q is not 26 characters", c.Token)
		}
		if err := s.Complete(ctx, c, time.Hour, []byte("out")); err != nil {
			t.Fatal(err)
		}
		v, _ = value()
		if wantV := append(append([]byte{'D'}, at(time.Hour)...), "out"...); len(v) != len(wantV)+8 || !bytes.Equal(v[:9], wantV[:9]) || !bytes.Equal(v[17:], []byte("out")) {
			t.Fatalf("done value = %q, want %q", v, wantV)
		}

		// Release leaves a purge marker, and a new claim writes over it.
		k2 := "another"
		c2, err := s.Claim(ctx, scope, []string{k2}, time.Minute)
		if err != nil || c2.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c2, err)
		}
		if err := s.Release(ctx, c2); err != nil {
			t.Fatal(err)
		}
		hist, err := kv.History(ctx, natsstore.RecordKey(scope, k2))
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) != 1 || hist[0].Operation() != jetstream.KeyValuePurge {
			t.Fatalf("after Release the key's history is %d entries, the last %v; want one purge marker", len(hist), hist[len(hist)-1].Operation())
		}
		if c3, err := s.Claim(ctx, scope, []string{k2}, time.Minute); err != nil || c3.Result != stores.Claimed || c3.Takeover {
			t.Fatalf("Claim over a purge marker = %+v, %v", c3, err)
		}
		// One message per record: the bucket keeps no history.
		if n := streamMsgs(t, nc, cfg.Bucket); n != 2 {
			t.Fatalf("%d messages in the stream, want 2", n)
		}
	})
}

// TestForeignValue: a key holding a value the store did not write is a
// fault to fix, not an outage and not a record.
func TestForeignValue(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		cfg := natsstore.Config{Bucket: testBucket()}
		s := newStore(t, nc, cfg)
		ctx := context.Background()
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, natsstore.RecordKey("s", "k"), []byte("hello")); err != nil {
			t.Fatal(err)
		}
		_, err = s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrInvalidArgument) {
			t.Fatalf("Claim of a foreign value = %v, want an unclassified error", err)
		}
	})
}

// TestDataTooLarge: data the server's maximum payload cannot carry is
// refused before any I/O, and the claim can still complete without it.
func TestDataTooLarge(t *testing.T) {
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s := newStore(t, nc, natsstore.Config{})
		ctx := context.Background()
		c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		big := make([]byte, nc.MaxPayload())
		errtest.NotOutage(t, "Complete with data of MaxPayload bytes", s.Complete(ctx, c, time.Hour, big), stores.ErrInvalidArgument)
		fits := make([]byte, nc.MaxPayload()-1024)
		if err := s.Complete(ctx, c, time.Hour, fits); err != nil {
			t.Fatalf("Complete with %d bytes of data: %v", len(fits), err)
		}
		if d, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil || d.Result != stores.Duplicate || len(d.Data) != len(fits) {
			t.Fatalf("Claim after Complete = %v, %v", d, err)
		}
	})
}

// TestCloseLeavesConnOpen: Close never closes the caller's connection
// and stops everything the store started.
func TestCloseLeavesConnOpen(t *testing.T) {
	onURLs(t, closeLeavesConnOpen)
}

func closeLeavesConnOpen(t *testing.T, url string) {
	other := connect(t, url)
	cfg := natsstore.Config{Bucket: testBucket()}
	deleteBuckets(t, other, cfg)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := natsstore.New(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if !nc.IsConnected() {
		t.Fatal("Close closed the caller's connection")
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("the caller's connection after Close: %v", err)
	}
	nc.Close()
}

// TestConnectOwnsConn: the connection Connect opens is the store's, and
// Close closes it (no goroutine of it is left).
func TestConnectOwnsConn(t *testing.T) {
	onURLs(t, connectOwnsConn)
}

func connectOwnsConn(t *testing.T, url string) {
	cfg := natsstore.Config{Bucket: testBucket()}
	deleteBuckets(t, connect(t, url), cfg)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	s, err := natsstore.Connect(ctx, url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, "s", []string{"k"}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, "s", []string{"k2"}, time.Minute)
	errtest.NotOutage(t, "Claim after Close", err, stores.ErrClosed)

	// Nothing listens: Connect fails as an outage.
	_, err = natsstore.Connect(ctx, "nats://127.0.0.1:1", cfg, nats.Timeout(time.Second))
	if !errors.Is(err, stores.ErrUnavailable) {
		t.Fatalf("Connect to a closed port = %v, want ErrUnavailable", err)
	}
}
