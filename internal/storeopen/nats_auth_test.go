package storeopen_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// Each way to authenticate, and TLS with a private CA, on NATS servers
// of the test's own: the connection works, and no error shows a
// password or a token.

const (
	natsPassword = "pw-Secret-4711"
	natsToken    = "tok-Secret-0815"
)

// natsTLSServer starts a server that requires TLS (a certificate of a
// private CA, for 127.0.0.1) and a user: alice with natsPassword, or the
// nkey whose seed file it returns.
func natsTLSServer(t *testing.T) (addr string, files *testkit.TLSFiles, seedFile string) {
	t.Helper()
	files = testkit.MakeTLSFiles(t)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n}\n" +
		"authorization {\n  users = [\n    {user: alice, password: \"" + natsPassword + "\"}\n    {nkey: " + pub + "}\n  ]\n}\n"
	addr = testkit.StartNATSSecure(t, conf, nats.UserInfo("alice", natsPassword), nats.RootCAs(files.CA))
	return addr, files, seedFile
}

// usable checks that nc reaches JetStream, over TLS when tls is set.
func usable(t *testing.T, what string, nc *nats.Conn, err error, tls bool) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("%s: JetStream: %v", what, err)
	}
	if _, err := nc.TLSConnectionState(); (err == nil) != tls {
		t.Fatalf("%s: TLS %v, want %v", what, err == nil, tls)
	}
}

// noSecret fails when err shows a secret.
func noSecret(t *testing.T, what string, err error) {
	t.Helper()
	for _, s := range []string{natsPassword, natsToken} {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("%s: the error shows a secret: %v", what, err)
		}
	}
}

func TestNATSTLSAndUsers(t *testing.T) {
	addr, files, seedFile := natsTLSServer(t)
	ctx := context.Background()
	o := storeopen.Opener{}
	withCA := storeopen.NATSAuth{CAFile: files.CA}

	nc, err := o.NATS(ctx, "tls://alice:"+natsPassword+"@"+addr, withCA)
	usable(t, "user and password in a tls:// URL", nc, err, true)
	auth := withCA
	auth.User, auth.Password = "alice", natsPassword
	nc, err = o.NATS(ctx, "tls://"+addr, auth)
	usable(t, "-nats-user and -nats-password", nc, err, true)
	auth = withCA
	auth.NKeyFile = seedFile
	nc, err = o.NATS(ctx, "tls://"+addr, auth)
	usable(t, "-nats-nkey", nc, err, true)
	// A nats:// URL: nats.go follows the server's demand for TLS.
	nc, err = o.NATS(ctx, "nats://alice:"+natsPassword+"@"+addr, withCA)
	usable(t, "a nats:// URL to a server that requires TLS", nc, err, true)

	// The server's certificate is not trusted without the CA.
	_, err = o.NATS(ctx, "tls://alice:"+natsPassword+"@"+addr, storeopen.NATSAuth{})
	var ue *storeopen.UnreachableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-nats-ca") || !strings.Contains(err.Error(), "tls://"+addr) {
		t.Fatalf("TLS without the CA: %v", err)
	}
	noSecret(t, "TLS without the CA", err)

	// A wrong password: refused, saying what to check.
	_, err = o.NATS(ctx, "tls://alice:wrong-"+natsPassword+"@"+addr, withCA)
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "NATS at tls://"+addr+" refused the connection (check the credentials in -nats-url") {
		t.Fatalf("a wrong password: %v", err)
	}
	noSecret(t, "a wrong password", err)
	auth = withCA
	auth.User, auth.Password = "alice", "wrong-"+natsPassword
	_, err = o.NATS(ctx, "tls://"+addr, auth)
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "refused the connection") {
		t.Fatalf("a wrong -nats-password: %v", err)
	}
	noSecret(t, "a wrong -nats-password", err)
}

func TestNATSToken(t *testing.T) {
	addr := testkit.StartNATSSecure(t, "authorization {\n  token: \""+natsToken+"\"\n}\n", nats.Token(natsToken))
	ctx := context.Background()
	o := storeopen.Opener{}
	nc, err := o.NATS(ctx, "nats://"+natsToken+"@"+addr, storeopen.NATSAuth{})
	usable(t, "a token in the URL", nc, err, false)
	nc, err = o.NATS(ctx, "nats://"+addr, storeopen.NATSAuth{Token: natsToken})
	usable(t, "-nats-token", nc, err, false)
	for _, tc := range []struct {
		url  string
		auth storeopen.NATSAuth
	}{
		{"nats://wrong-" + natsToken + "@" + addr, storeopen.NATSAuth{}},
		{"nats://" + addr, storeopen.NATSAuth{Token: "wrong-" + natsToken}},
		{"nats://" + addr, storeopen.NATSAuth{}},
	} {
		_, err := o.NATS(ctx, tc.url, tc.auth)
		if err == nil || !strings.Contains(err.Error(), "NATS at nats://"+addr+" refused the connection") {
			t.Fatalf("%s with %+v: %v", storeopen.RedactNATSURL(tc.url), tc.auth, err)
		}
		noSecret(t, "a wrong token", err)
	}
}
