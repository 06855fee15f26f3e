package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

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
	addr := testkit.StartNATSSecure(t, conf, nats.UserInfo("ctl", password), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	nc, err := nats.Connect("tls://ctl:"+password+"@"+addr, nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s, err := natsstore.New(t.Context(), nc, natsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	tg := &target{kind: testkit.StoreNATS, store: s, admin: s}
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
