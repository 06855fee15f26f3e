package main

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
)

// -broker=nats on a server that requires TLS (a private CA) and a user
// with a password: the run holds the invariant; the password, given in
// the URL or in the environment, is never printed, and a wrong one is a
// refusal that names what to check.
func TestExampleNATSCredentialsAndTLS(t *testing.T) {
	t.Parallel()
	buildExample(t)
	const password = "nats-Secret-9931"
	files := testkit.MakeTLSFiles(t)
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n}\n" +
		"authorization {\n  users = [\n    {user: loyalty, password: \"" + password + "\"}\n  ]\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserInfo("loyalty", password), nats.RootCAs(files.CA))
	secretFree := func(r exampleRun) {
		t.Helper()
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the password is printed\n%s", r)
		}
	}

	r := runExample(t, newTestRunID(), "-broker=nats", "-store=memory", "-nats-url=tls://loyalty:"+password+"@"+addr, "-nats-ca="+files.CA)
	requireOK(t, r)
	secretFree(r)
	if !strings.Contains(r.stdout+r.stderr, "tls://"+addr) {
		t.Fatalf("the run does not say where the broker is\n%s", r)
	}

	r = runExampleEnv(t, newTestRunID(), []string{"DEDUP_NATS_PASSWORD=" + password, "DEDUP_NATS_USER=loyalty", "DEDUP_NATS_CA=" + files.CA},
		"-broker=nats", "-store=memory", "-nats-url=tls://"+addr)
	requireOK(t, r)
	secretFree(r)

	r = runExample(t, newTestRunID(), "-broker=nats", "-store=memory", "-nats-url=tls://loyalty:wrong-"+password+"@"+addr, "-nats-ca="+files.CA)
	if r.code != exitConfig || !strings.Contains(r.stderr, "NATS at tls://"+addr+" refused the connection (check the credentials") {
		t.Fatalf("a wrong password: want exit %d and a refusal\n%s", exitConfig, r)
	}
	secretFree(r)
	r = runExample(t, newTestRunID(), "-broker=nats", "-store=memory", "-nats-url=tls://loyalty:"+password+"@"+addr)
	if r.code != exitConfig || !strings.Contains(r.stderr, "-nats-ca") {
		t.Fatalf("TLS without the CA: want exit %d and a hint at -nats-ca\n%s", exitConfig, r)
	}
	secretFree(r)
}
