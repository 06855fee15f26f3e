package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/testkit"
)

// -store=nats beyond what every store does (main_test.go runs get, list,
// forget, release, stats and purge on NATS too): a bucket that does not
// exist is not created, a sharded store is found with -nats-shards, and
// a bucket New would refuse for its MaxAge is read all the same.
func TestNATSBuckets(t *testing.T) {
	addr := testkit.RequireStore(t, testkit.StoreNATS)
	url := "nats://" + addr
	// Three shards, and a MaxAge shorter than dedupctl's defaults ask for.
	cfg := natsstore.Config{Shards: 3, MaxLease: time.Minute, MaxRetention: time.Hour}
	o, closeStore, err := testkit.OpenStore(context.Background(), testkit.StoreParams{Kind: testkit.StoreNATS, Addr: addr, Teardown: true, NATS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeStore(context.Background()) })
	missing := testkit.UniqueName("dedupctl_none_")
	dedupctl(t, "-store=nats", "-nats-url="+url, "-nats-bucket="+missing, "stats").
		want(t, exitError, "stderr:no such bucket", "stderr:"+missing, "stderr:change -nats-bucket")
	js, err := jetstream.New(o.NATS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(t.Context(), "KV_"+missing); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("dedupctl created the bucket it did not find, or: %v", err)
	}
	tg := &target{kind: testkit.StoreNATS, store: o.Store, admin: o.Store.(stores.Admin), opened: o,
		args: []string{"-store=nats", "-nats-url=" + url, "-nats-bucket=" + o.Name, "-nats-shards=3"}}
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		tg.done(t, "s", k)
	}
	var st statsJSON
	tg.run(t, "stats", "-json").want(t, exitOK).json(t, &st)
	if st.Done != 6 || st.PerScope {
		t.Fatalf("stats -json = %+v", st)
	}
	tg.run(t, "stats").want(t, exitOK, "stdout:buckets "+o.Name+"-0, "+o.Name+"-1, "+o.Name+"-2", "stdout:no counts by scope")
	tg.run(t, "get", "s", "d").want(t, exitOK).field(t, "state", "done")
	tg.run(t, "forget", "s", "d", "-yes").want(t, exitOK, `stdout:forgot scope "s" key "d"`)
	tg.run(t, "list", "s").want(t, exitUsage, "stderr:digest of (scope, key)")
	// Without -nats-shards the buckets are not found.
	dedupctl(t, "-store=nats", "-nats-url="+url, "-nats-bucket="+o.Name, "stats").want(t, exitError, "stderr:no such bucket", "stderr:-nats-shards")
}

func TestNATSUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-store=nats", "-nats-shards=65", "stats"}, "Shards must be between 0 and 64"},
		{[]string{"-store=nats", "-nats-bucket=a.b", "stats"}, "Bucket \"a.b\""},
		{[]string{"-store=nats", "-nats-password=s3cret", "stats"}, "-nats-password: a password needs a user"},
		{[]string{"-store=nats", "-nats-token=t", "-nats-user=u", "stats"}, "give one way to authenticate"},
		{[]string{"-store=nats", "-nats-url=nats://%zz@h", "stats"}, "is not a NATS URL"},
	} {
		r := dedupctl(t, tc.args...).want(t, exitUsage, "stderr:"+tc.want)
		if strings.Contains(r.stderr, "s3cret") {
			t.Fatalf("a password is printed: %s", r)
		}
	}
	dedupctl(t, "-help").want(t, exitOK, "stdout:[env NATS_URL]", "stdout:[env DEDUP_NATS_BUCKET]", "stdout:-nats-creds")
	var w windowView
	dedupctl(t, "window", "-store=nats", "-horizon=1h", "-rate=10", "-json").want(t, exitOK).json(t, &w)
	if w.BytesPerRecord != natsBytesPerRecord || w.Records != 46800 {
		t.Fatalf("window -store=nats = %+v", w)
	}
}

func TestNATSUnreachable(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	r := dedupctl(t, "-store=nats", "-nats-url=nats://alice:s3cret@"+addr, "stats").
		want(t, exitError, "stderr:NATS is not reachable at nats://"+addr+" (change it with -nats-url or NATS_URL)")
	if strings.Contains(r.stderr, "s3cret") || strings.Contains(r.stderr, "alice") {
		t.Fatalf("the credentials are printed: %s", r)
	}
	dedupctlEnv(t, map[string]string{"DEDUP_STORE": "nats", "NATS_URL": "nats://" + addr}, "stats").want(t, exitError, "stderr:NATS is not reachable at nats://"+addr)
}

// The NATS credential flags are connection flags: read from the
// environment, allowed with every command.
func TestNATSAuthFlagsAreConnectionFlags(t *testing.T) {
	for _, name := range storeopen.NATSAuthFlags {
		if !isConnectionFlag(name) {
			t.Errorf("-%s is not in connectionFlags", name)
		}
	}
}
