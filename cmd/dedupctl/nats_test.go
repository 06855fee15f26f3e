package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// -store=nats beyond what every store does (main_test.go runs get, list,
// forget, release, stats and purge on NATS too): a bucket that does not
// exist is not created, a sharded store is found with -nats-shards, and
// a bucket New would refuse for its MaxAge is read all the same.
func TestNATSBuckets(t *testing.T) {
	addr := anystore.RequireStore(t, anystore.StoreNATS)
	url := "nats://" + addr
	// Three shards, and a MaxAge shorter than dedupctl's defaults ask for.
	cfg := natsstore.Config{Shards: 3, MaxLease: time.Minute, MaxRetention: time.Hour}
	o, closeStore, err := anystore.OpenStore(context.Background(), anystore.StoreParams{Kind: anystore.StoreNATS, Addr: addr, Teardown: true, NATS: cfg})
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
	tg := &target{kind: anystore.StoreNATS, store: o.Store, admin: o.Store.(stores.Admin), opened: o,
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
	w := windowJSON(t, "-store=nats", "-horizon=1h", "-rate=10")
	if r := w.row(t, storeNATS, false); value(r.BytesPerRecord) != natsBytesPerRecord || w.Records != 46800 || len(w.Storage) != 1 {
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

// Every command on a NATS server of the test's own that requires TLS (a
// private CA) and credentials, as a user allowed only the store's and
// the admin scans' subjects of the bucket (natsstore's README,
// Permissions): they work, and print no password; a wrong one is a
// refusal.
func TestNATSCredentialsAndTLS(t *testing.T) {
	const password = "ctl-Secret-2718"
	files := testkit.MakeTLSFiles(t)
	var allow []string
	for _, s := range []string{
		"$JS.API.STREAM.INFO.KV_dedup", "$KV.dedup.>", "$JS.API.DIRECT.GET.KV_dedup.>", "$JS.API.STREAM.MSG.GET.KV_dedup",
		"$JS.API.CONSUMER.CREATE.KV_dedup.>", "$JS.API.CONSUMER.MSG.NEXT.KV_dedup.*", "$JS.API.CONSUMER.DELETE.KV_dedup.*",
	} {
		allow = append(allow, strconv.Quote(s))
	}
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n}\n" +
		"authorization {\n  users = [\n    {user: root, password: root}\n" +
		"    {user: ctl, password: \"" + password + "\", permissions: {publish: {allow: [" + strings.Join(allow, ", ") + "]}, subscribe: {allow: [\"_INBOX.>\"]}}}\n  ]\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserInfo("root", "root"), nats.RootCAs(files.CA))
	tg := natsTarget(t, "tls://root:root@"+addr, nats.RootCAs(files.CA))
	tg.args = []string{"-store=nats", "-nats-url=tls://ctl:" + password + "@" + addr, "-nats-ca=" + files.CA}
	tg.done(t, "s", "d1")
	tg.done(t, "s", "d2")
	tg.claim(t, "s", "p1", time.Minute)
	secretFree := func(r result) {
		t.Helper()
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the password is printed: %s", r)
		}
	}
	for _, args := range [][]string{
		{"stats"}, {"get", "s", "d1"}, {"list", "-limit=1"}, {"forget", "s", "d1", "-yes"}, {"release", "s", "p1", "-yes"}, {"purge"},
	} {
		secretFree(tg.run(t, args...).want(t, exitOK))
	}
	tg.run(t, "purge").want(t, exitOK, "stdout:on NATS tls://"+addr+", bucket dedup")
	var st statsJSON
	tg.run(t, "stats", "-json").want(t, exitOK).json(t, &st)
	if st.Done != 1 || st.Processing != 0 {
		t.Fatalf("stats after forget and release = %+v", st)
	}
	// The password in the environment instead.
	r := dedupctlEnv(t, map[string]string{"DEDUP_NATS_USER": "ctl", "DEDUP_NATS_PASSWORD": password, "DEDUP_NATS_CA": files.CA, "NATS_URL": "tls://" + addr},
		"-store=nats", "get", "s", "d2").want(t, exitOK)
	secretFree(r)
	r = dedupctl(t, "-store=nats", "-nats-url=tls://ctl:wrong-"+password+"@"+addr, "-nats-ca="+files.CA, "stats").
		want(t, exitError, "stderr:NATS at tls://"+addr+" refused the connection (check the credentials")
	secretFree(r)
}

// TestNATSClientCert: on a NATS server of the test's own that requires
// TLS with a client certificate its CA signed (tls verify) and a user,
// dedupctl works with -nats-cert and -nats-key, or their environment
// variables; without the certificate, or with half of it, it says what
// to give, and no output shows the password.
func TestNATSClientCert(t *testing.T) {
	const password = "ctl-mTLS-Secret-1618"
	files := testkit.MakeTLSFiles(t)
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + files.CA + "\"\n  verify: true\n}\n" +
		"authorization {\n  users = [\n    {user: ctl, password: \"" + password + "\"}\n  ]\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserInfo("ctl", password), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	tg := natsTarget(t, "tls://ctl:"+password+"@"+addr, nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	tg.done(t, "s", "d1")

	secretFree := func(r result) result {
		t.Helper()
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the password is printed: %s", r)
		}
		return r
	}
	url := "-nats-url=tls://ctl:" + password + "@" + addr
	ca, cert, key := "-nats-ca="+files.CA, "-nats-cert="+files.ClientCert, "-nats-key="+files.ClientKey
	secretFree(dedupctl(t, "-store=nats", url, ca, cert, key, "get", "s", "d1").want(t, exitOK, "stdout:done"))
	secretFree(dedupctl(t, "-store=nats", url, ca, cert, key, "stats").want(t, exitOK, "stdout:NATS tls://"+addr+", bucket dedup"))
	secretFree(dedupctlEnv(t, map[string]string{
		"NATS_URL": "tls://" + addr, "DEDUP_NATS_USER": "ctl", "DEDUP_NATS_PASSWORD": password,
		"DEDUP_NATS_CA": files.CA, "DEDUP_NATS_CERT": files.ClientCert, "DEDUP_NATS_KEY": files.ClientKey,
	}, "-store=nats", "get", "s", "d1").want(t, exitOK, "stdout:done"))

	secretFree(dedupctl(t, "-store=nats", url, ca, "stats").
		want(t, exitError, "stderr:NATS at tls://"+addr+" refused the connection (check the client certificate its CA signed in -nats-cert and -nats-key)"))
	secretFree(dedupctl(t, "-store=nats", url, ca, cert, "stats").want(t, exitUsage, "stderr:-nats-key: a client certificate needs its key"))
	secretFree(dedupctl(t, "-store=nats", url, ca, key, "stats").want(t, exitUsage, "stderr:-nats-cert: a client key needs its certificate"))
	dedupctl(t, "-help").want(t, exitOK, "stdout:[env DEDUP_NATS_CERT]", "stdout:[env DEDUP_NATS_KEY]")
}

// natsTarget connects to the NATS server of url with opts and returns a
// target on a store there (the default bucket), both closed when t ends;
// the caller sets its args.
func natsTarget(t *testing.T, url string, opts ...nats.Option) *target {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s, err := natsstore.New(t.Context(), nc, natsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return &target{kind: anystore.StoreNATS, store: s, admin: s}
}
