package main

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
)

// -broker=nats on a server that requires TLS with a client certificate
// its CA signed (tls verify) and a user: the run holds the invariant
// with -nats-cert and -nats-key, or their environment variables; without
// the certificate it is a refusal naming them; no output shows the
// password.
func TestExampleNATSClientCert(t *testing.T) {
	t.Parallel()
	buildExample(t)
	const password = "nats-mTLS-Secret-2236"
	files := testkit.MakeTLSFiles(t)
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + files.CA + "\"\n  verify: true\n}\n" +
		"authorization {\n  users = [\n    {user: loyalty, password: \"" + password + "\"}\n  ]\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserInfo("loyalty", password), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	secretFree := func(r exampleRun) {
		t.Helper()
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the password is printed\n%s", r)
		}
	}
	url := "-nats-url=tls://loyalty:" + password + "@" + addr

	r := runExample(t, newTestRunID(), "-broker=nats", "-store=memory", url, "-nats-ca="+files.CA, "-nats-cert="+files.ClientCert, "-nats-key="+files.ClientKey)
	requireOK(t, r)
	secretFree(r)

	r = runExampleEnv(t, newTestRunID(), []string{"DEDUP_NATS_CA=" + files.CA, "DEDUP_NATS_CERT=" + files.ClientCert, "DEDUP_NATS_KEY=" + files.ClientKey},
		"-broker=nats", "-store=memory", url)
	requireOK(t, r)
	secretFree(r)

	r = runExample(t, newTestRunID(), "-broker=nats", "-store=memory", url, "-nats-ca="+files.CA)
	if r.code != exitConfig || !strings.Contains(r.stderr, "NATS at tls://"+addr+" refused the connection (check the client certificate its CA signed in -nats-cert and -nats-key)") {
		t.Fatalf("no client certificate: want exit %d and a refusal naming -nats-cert and -nats-key\n%s", exitConfig, r)
	}
	secretFree(r)
	r = runExample(t, newTestRunID(), "-broker=nats", "-store=memory", url, "-nats-ca="+files.CA, "-nats-cert="+files.ClientCert)
	if r.code != exitConfig || !strings.Contains(r.stderr, "-nats-key: a client certificate needs its key") {
		t.Fatalf("a certificate without its key: want exit %d\n%s", exitConfig, r)
	}
	secretFree(r)
}
