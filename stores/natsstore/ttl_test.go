package natsstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// lastMsg returns the last message of subject in bucket's stream, nil
// when it has none.
func lastMsg(t testing.TB, js jetstream.JetStream, bucket, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newJS(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// claimTTL claims key in scope "ttl" for lease, and fails t unless it is
// Claimed.
func claimTTL(t testing.TB, s *natsstore.Store, key string, lease time.Duration) *stores.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), "ttl", []string{key}, lease)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("claim %s: %+v, %v", key, c, err)
	}
	return c
}

// TestPerKeyTTL: on the current server each record has a TTL of its own
// in one bucket: a done record its retention, a processing record two
// leases, a released key's marker a minute, each plus ClockSkew, in
// whole seconds. A record whose short retention ran out is removed by
// the server (no store call reads it) while one with a long retention
// in the same bucket stays, and its key is then claimed anew, not as a
// takeover. The bucket has no MaxAge.
func TestPerKeyTTL(t *testing.T) {
	nc := currentConn(t)
	js := newJS(t, nc)
	logs := watermill.NewCaptureLogger()
	s := newStore(t, nc, natsstore.Config{ClockSkew: time.Millisecond, Logger: logs})
	bucket := s.Buckets()[0]
	ctx := context.Background()

	info, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	conf := info.CachedInfo().Config
	if !conf.AllowMsgTTL || conf.MaxAge != 0 || conf.SubjectDeleteMarkerTTL != time.Minute {
		t.Errorf("bucket: AllowMsgTTL %t, MaxAge %s, SubjectDeleteMarkerTTL %s; want true, 0, 1m",
			conf.AllowMsgTTL, conf.MaxAge, conf.SubjectDeleteMarkerTTL)
	}
	if got := s.Capabilities().MaxRetention; got != natsstore.MaxDurationLimit {
		t.Errorf("Capabilities().MaxRetention = %s, want %s", got, natsstore.MaxDurationLimit)
	}
	if logged := logs.Captured()[watermill.InfoLogLevel]; len(logged) != 1 || logged[0].Msg != "natsstore: records expire by per-key TTL" ||
		logged[0].Fields["buckets"] != bucket {
		t.Errorf("New logged %+v, want one line saying records of %s expire by per-key TTL", logged, bucket)
	}

	// Open (dedupctl) follows the bucket, whatever the config says.
	adm, err := natsstore.Open(ctx, nc, natsstore.Config{Bucket: bucket, TTLMode: natsstore.TTLBucket})
	if err != nil {
		t.Fatal(err)
	}
	if adm.TTLMode() != natsstore.TTLPerKey {
		t.Errorf("Open on a bucket with per-message TTLs: %s", adm.TTLMode())
	}
	_ = adm.Close(ctx)

	short, long := claimTTL(t, s, "short", time.Minute), claimTTL(t, s, "long", time.Minute)
	if got := lastMsg(t, js, bucket, s.Subject("ttl", "short")).Header.Get(jetstream.MsgTTLHeader); got != "121" {
		t.Errorf("a processing record of a 1m lease has Nats-TTL %q, want 121 (two leases and ClockSkew, rounded up)", got)
	}
	if err := s.Complete(ctx, short, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, long, 48*time.Hour, []byte("kept")); err != nil {
		t.Fatalf("a retention of 48h, twice MaxRetention's default: %v", err)
	}
	if got := lastMsg(t, js, bucket, s.Subject("ttl", "long")).Header.Get(jetstream.MsgTTLHeader); got != "172801" {
		t.Errorf("a done record of 48h has Nats-TTL %q, want 172801", got)
	}
	rel := claimTTL(t, s, "released", time.Minute)
	if err := s.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	if got := lastMsg(t, js, bucket, s.Subject("ttl", "released")).Header.Get(jetstream.MsgTTLHeader); got != "60" {
		t.Errorf("a purge marker has Nats-TTL %q, want 60", got)
	}

	// The server removes the short record two seconds after its write,
	// leaving its marker (Nats-Marker-Reason) or nothing.
	testkit.WaitFor(t, time.Minute, "the server to remove the record of retention 1s", func() bool {
		m := lastMsg(t, js, bucket, s.Subject("ttl", "short"))
		return m == nil || m.Header.Get(jetstream.MarkerReasonHeader) != ""
	})
	if m := lastMsg(t, js, bucket, s.Subject("ttl", "long")); m == nil || string(m.Data[len(m.Data)-4:]) != "kept" {
		t.Fatalf("the record of retention 48h is gone with the short one: %+v", m)
	}
	// The server's marker is no record to the admin calls either.
	if _, err := s.Get(ctx, "ttl", "short"); !errors.Is(err, stores.ErrNotFound) {
		t.Errorf("Get of the expired record: %v, want ErrNotFound", err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Done != 1 {
		t.Errorf("Stats after the expiry: %+v, %v; want the one done record left", st, err)
	}
	c, err := s.Claim(ctx, "ttl", []string{"long"}, time.Minute)
	if err != nil || c.Result != stores.Duplicate || string(c.Data) != "kept" {
		t.Errorf("claim of the long record: %+v, %v; want a duplicate with its data", c, err)
	}
	c, err = s.Claim(ctx, "ttl", []string{"short"}, time.Minute)
	if err != nil || c.Result != stores.Claimed || c.Takeover {
		t.Errorf("claim of the expired record: %+v, %v; want claimed, no takeover", c, err)
	}
}

// TestRetentionBoundByServer: a retention longer than MaxRetention (its
// default, 24h) is refused on the shared server, whose buckets expire by
// their MaxAge, and accepted on the current one, up to a century, which
// the server then keeps.
func TestRetentionBoundByServer(t *testing.T) {
	const long = 48 * time.Hour
	onServers(t, func(t *testing.T, nc *nats.Conn) {
		s := newStore(t, nc, natsstore.Config{})
		ctx := context.Background()
		err := s.Complete(ctx, claimTTL(t, s, "a", time.Minute), long, nil)
		if s.TTLMode() == natsstore.TTLBucket {
			if !errors.Is(err, stores.ErrInvalidArgument) {
				t.Errorf("a retention of %s under the bucket's MaxAge: %v, want ErrInvalidArgument", long, err)
			}
			if got := s.Capabilities().MaxRetention; got != natsstore.DefaultMaxRetention {
				t.Errorf("Capabilities().MaxRetention = %s, want %s", got, natsstore.DefaultMaxRetention)
			}
			return
		}
		if err != nil {
			t.Errorf("a retention of %s under per-key TTLs: %v", long, err)
		}
		if err := s.Complete(ctx, claimTTL(t, s, "b", time.Minute), natsstore.MaxDurationLimit, nil); err != nil {
			t.Errorf("a retention of a century under per-key TTLs: %v", err)
		}
		if c, err := s.Claim(ctx, "ttl", []string{"b"}, time.Minute); err != nil || c.Result != stores.Duplicate {
			t.Errorf("claim of the century's record: %+v, %v; want a duplicate", c, err)
		}
	})
}

// TestTTLPerKeyNeedsServer: Config.TTLMode TTLPerKey on a server without
// per-message TTLs (the shared nats-server 2.9.10) fails New with
// ErrBucketConfig and creates no bucket; TTLBucket on the current
// server gives the bucket a MaxAge and the records no TTL.
func TestTTLPerKeyNeedsServer(t *testing.T) {
	t.Run("shared", func(t *testing.T) {
		nc := sharedConn(t)
		cfg, js := freshBucket(t, nc)
		if _, level := nc.ConnectedServerJetStream(); level >= 1 {
			t.Fatalf("the shared server (nats-server %s) has per-message TTLs: this test needs one that has none", nc.ConnectedServerVersion())
		}
		cfg.TTLMode = natsstore.TTLPerKey
		_, err := natsstore.New(context.Background(), nc, cfg)
		if !errors.Is(err, natsstore.ErrBucketConfig) || !strings.Contains(err.Error(), "2.11") {
			t.Errorf("TTLPerKey on nats-server %s: %v, want ErrBucketConfig naming 2.11", nc.ConnectedServerVersion(), err)
		}
		if _, err := js.Stream(context.Background(), "KV_"+cfg.Bucket); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("a refused New left bucket %s: %v", cfg.Bucket, err)
		}
	})
	t.Run("current", func(t *testing.T) {
		nc := currentConn(t)
		js := newJS(t, nc)
		s := newStore(t, nc, natsstore.Config{TTLMode: natsstore.TTLBucket})
		bucket := s.Buckets()[0]
		st, err := js.Stream(context.Background(), "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		conf := st.CachedInfo().Config
		if conf.AllowMsgTTL || conf.MaxAge != natsstore.DefaultMaxRetention+natsstore.DefaultClockSkew {
			t.Errorf("TTLBucket's bucket: AllowMsgTTL %t, MaxAge %s", conf.AllowMsgTTL, conf.MaxAge)
		}
		claimTTL(t, s, "a", time.Minute)
		if m := lastMsg(t, js, bucket, s.Subject("ttl", "a")); m.Header.Get(jetstream.MsgTTLHeader) != "" {
			t.Errorf("a record under TTLBucket has Nats-TTL %q", m.Header.Get(jetstream.MsgTTLHeader))
		}
	})
}

// TestExistingBucketWithoutTTL: on the current server, a bucket created
// as nats-server 2.9 creates it (a MaxAge, no per-message TTLs) keeps
// the store on its MaxAge (TTLAuto picks TTLBucket, TTLPerKey is
// refused), so an upgraded deployment expires records as before. Once
// an operator allows per-message TTLs on its stream, the store gives
// records TTLs of their own, and the MaxAge, which still removes them,
// bounds retentions (MaxAge less ClockSkew).
func TestExistingBucketWithoutTTL(t *testing.T) {
	nc := currentConn(t)
	js := newJS(t, nc)
	ctx := context.Background()
	cfg := natsstore.Config{Bucket: testBucket()}
	deleteBuckets(t, nc, cfg)
	maxAge := cfg.RequiredMaxAge()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Bucket, History: 1, TTL: maxAge}); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, nc, cfg)
	if s.TTLMode() != natsstore.TTLBucket {
		t.Fatalf("a bucket without per-message TTLs: the store expires records by %s", s.TTLMode())
	}
	if err := s.Complete(ctx, claimTTL(t, s, "a", time.Minute), 48*time.Hour, nil); !errors.Is(err, stores.ErrInvalidArgument) {
		t.Errorf("a retention of 48h on the bucket's MaxAge: %v, want ErrInvalidArgument", err)
	}
	perKey := cfg
	perKey.TTLMode = natsstore.TTLPerKey
	if _, err := natsstore.New(ctx, nc, perKey); !errors.Is(err, natsstore.ErrBucketConfig) {
		t.Errorf("TTLPerKey on a bucket without per-message TTLs: %v, want ErrBucketConfig", err)
	}

	st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.AllowMsgTTL = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatalf("allow per-message TTLs on the stream: %v", err)
	}
	s2 := openStore(t, nc, cfg)
	if s2.TTLMode() != natsstore.TTLPerKey {
		t.Fatalf("a bucket with per-message TTLs and a MaxAge: the store expires records by %s", s2.TTLMode())
	}
	if got, want := s2.Capabilities().MaxRetention, maxAge-natsstore.DefaultClockSkew; got != want {
		t.Errorf("Capabilities().MaxRetention = %s, want the MaxAge less ClockSkew, %s", got, want)
	}
	if err := s2.Complete(ctx, claimTTL(t, s2, "b", time.Minute), 48*time.Hour, nil); !errors.Is(err, stores.ErrInvalidArgument) {
		t.Errorf("a retention past the MaxAge: %v, want ErrInvalidArgument", err)
	}
	if err := s2.Complete(ctx, claimTTL(t, s2, "c", time.Minute), 2*time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	if got := lastMsg(t, js, cfg.Bucket, s2.Subject("ttl", "c")).Header.Get(jetstream.MsgTTLHeader); got != "7260" {
		t.Errorf("a done record of 2h has Nats-TTL %q, want 7260", got)
	}
}

func TestTTLModeString(t *testing.T) {
	for m, want := range map[natsstore.TTLMode]string{
		natsstore.TTLAuto: "auto", natsstore.TTLBucket: "bucket MaxAge", natsstore.TTLPerKey: "per-key TTL", 7: "TTLMode(7)",
	} {
		if got := m.String(); got != want {
			t.Errorf("TTLMode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}
