package storeopen_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
)

// A NATS URL is shown without its credentials: a user and password, or a
// token where the user goes.
func TestRedactNATSURL(t *testing.T) {
	for raw, want := range map[string]string{
		"nats://127.0.0.1:4222":                    "nats://127.0.0.1:4222",
		"nats://alice:s3cret@127.0.0.1:4222":       "nats://127.0.0.1:4222",
		"nats://T0KEN@host":                        "nats://host",
		"tls://bob:pw@a:4222, tls://bob:pw@b:4222": "tls://a:4222,tls://b:4222",
		"127.0.0.1:4222":                           "nats://127.0.0.1:4222",
		"nats://%zz@host":                          "(unparsable URL)",
		"nats://user:p%40ss@[::1]:4222/?x=1":       "nats://[::1]:4222/?x=1",
	} {
		if got := storeopen.RedactNATSURL(raw); got != want {
			t.Errorf("RedactNATSURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// Settings that contradict each other, or name a file that cannot be
// read, are a *SettingError naming the flag, before anything connects.
func TestNATSAuthSettings(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		auth storeopen.NATSAuth
		want string
	}{
		{storeopen.NATSAuth{Password: "x"}, "-nats-password: a password needs a user"},
		{storeopen.NATSAuth{User: "u", Password: "p", Token: "t"}, "give one way to authenticate"},
		{storeopen.NATSAuth{Token: "t", CredsFile: filepath.Join(dir, "none.creds")}, "-nats-creds"},
		{storeopen.NATSAuth{NKeyFile: filepath.Join(dir, "none.nk")}, "-nats-nkey"},
		{storeopen.NATSAuth{CAFile: filepath.Join(dir, "none.pem")}, "-nats-ca"},
		{storeopen.NATSAuth{CAFile: notPEM}, "holds no PEM certificate"},
		{storeopen.NATSAuth{CertFile: notPEM}, "-nats-key: a client certificate needs its key"},
		{storeopen.NATSAuth{KeyFile: notPEM}, "-nats-cert: a client key needs its certificate"},
		{storeopen.NATSAuth{CertFile: notPEM, KeyFile: notPEM}, "-nats-cert and -nats-key"},
		{storeopen.NATSAuth{CertFile: filepath.Join(dir, "none.pem"), KeyFile: notPEM}, "-nats-cert and -nats-key"},
	} {
		_, err := storeopen.Opener{}.NATS(context.Background(), "nats://127.0.0.1:1", tc.auth)
		var se *storeopen.SettingError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NATS with %+v = %v, want a setting error saying %q", tc.auth, err, tc.want)
		}
	}
	_, err := storeopen.Opener{}.NATS(context.Background(), "nats://%zz@h", storeopen.NATSAuth{})
	var se *storeopen.SettingError
	if !errors.As(err, &se) || strings.Contains(err.Error(), "%zz") {
		t.Errorf("an unparsable URL: %v", err)
	}
}

// Nothing listening: the error names the URL, without its password,
// and the setting.
func TestNATSUnreachable(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	_, err := storeopen.Opener{}.NATS(context.Background(), "nats://alice:s3cret@"+addr, storeopen.NATSAuth{})
	var ue *storeopen.UnreachableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "NATS is not reachable at nats://"+addr+" (change it with -nats-url or NATS_URL)") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("NATS on a closed port = %v", err)
	}
}

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
	addr = natstest.StartNATSSecure(t, conf, nats.UserInfo("alice", natsPassword), nats.RootCAs(files.CA))
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
	addr := natstest.StartNATSSecure(t, "authorization {\n  token: \""+natsToken+"\"\n}\n", nats.Token(natsToken))
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

// A credentials file (-nats-creds) on a server in operator (JWT) mode.
// The JWTs are made here, with the nkeys module alone (the jwt module
// is not a dependency): a JWT is a header, claims and an ed25519
// signature by the issuer's nkey, each base64url-encoded.

// natsJWT returns the JWT of claims about subject, issued and signed by
// issuer, of kind ("operator", "account", "user") with the fields nats.
func natsJWT(t *testing.T, issuer nkeys.KeyPair, subject, name string, nats map[string]any) string {
	t.Helper()
	iss, err := issuer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	nats["version"] = 2
	head := enc(map[string]string{"typ": "JWT", "alg": "ed25519-nkey"})
	body := enc(map[string]any{"jti": name + strconv.FormatInt(time.Now().UnixNano(), 36), "iat": time.Now().Unix(), "iss": iss, "sub": subject, "name": name, "nats": nats})
	sig, err := issuer.Sign([]byte(head + "." + body))
	if err != nil {
		t.Fatal(err)
	}
	return head + "." + body + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestNATSCredsFile(t *testing.T) {
	operator, _ := nkeys.CreateOperator()
	account, _ := nkeys.CreateAccount()
	system, _ := nkeys.CreateAccount() // JetStream needs a system account
	sysPub, _ := system.PublicKey()
	user, _ := nkeys.CreateUser()
	opPub, _ := operator.PublicKey()
	accPub, _ := account.PublicKey()
	userPub, _ := user.PublicKey()
	unlimited := map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true,
		"conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
	opJWT := natsJWT(t, operator, opPub, "test-operator", map[string]any{"type": "operator"})
	accJWT := natsJWT(t, operator, accPub, "dedup", map[string]any{"type": "account", "limits": unlimited})
	sysJWT := natsJWT(t, operator, sysPub, "SYS", map[string]any{"type": "account", "limits": map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1}})
	userJWT := natsJWT(t, account, userPub, "dedup-user", map[string]any{"type": "user", "pub": map[string]any{}, "sub": map[string]any{}, "subs": -1, "data": -1, "payload": -1})
	seed, _ := user.Seed()

	dir := t.TempDir()
	opFile := filepath.Join(dir, "operator.jwt")
	if err := os.WriteFile(opFile, []byte(opJWT), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "user.creds")
	text := "-----BEGIN NATS USER JWT-----\n" + userJWT + "\n------END NATS USER JWT------\n\n" +
		"-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	if err := os.WriteFile(creds, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := "operator: \"" + opFile + "\"\nsystem_account: " + sysPub + "\nresolver: MEMORY\nresolver_preload: {\n  " +
		accPub + ": \"" + accJWT + "\"\n  " + sysPub + ": \"" + sysJWT + "\"\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserCredentials(creds))

	nc, err := storeopen.Opener{}.NATS(context.Background(), "nats://"+addr, storeopen.NATSAuth{CredsFile: creds})
	usable(t, "-nats-creds", nc, err, false)
	// Without them the server refuses.
	if _, err := (storeopen.Opener{}).NATS(context.Background(), "nats://"+addr, storeopen.NATSAuth{}); err == nil || !strings.Contains(err.Error(), "refused the connection") {
		t.Fatalf("without credentials: %v, want a refusal", err)
	}
}

// TestNATSClientCert: a server that requires TLS with a client
// certificate its CA signed (tls { verify: true }) and a user: the
// connection works with -nats-cert and -nats-key (and the CA); without
// the certificate, or with one another CA signed, it is refused with a
// hint at -nats-cert and -nats-key, and no error shows the password.
func TestNATSClientCert(t *testing.T) {
	files := testkit.MakeTLSFiles(t)
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + files.CA + "\"\n  verify: true\n}\n" +
		"authorization {\n  users = [\n    {user: alice, password: \"" + natsPassword + "\"}\n  ]\n}\n"
	addr := natstest.StartNATSSecure(t, conf, nats.UserInfo("alice", natsPassword), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
	ctx := context.Background()
	o := storeopen.Opener{}
	url := "tls://alice:" + natsPassword + "@" + addr
	auth := storeopen.NATSAuth{CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey}

	nc, err := o.NATS(ctx, url, auth)
	usable(t, "a client certificate", nc, err, true)

	refused := func(what string, auth storeopen.NATSAuth) {
		t.Helper()
		_, err := o.NATS(ctx, url, auth)
		var ue *storeopen.UnreachableError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "NATS at tls://"+addr) || !strings.Contains(err.Error(), "-nats-cert and -nats-key") {
			t.Fatalf("%s: %v, want a refusal naming -nats-cert and -nats-key", what, err)
		}
		noSecret(t, what, err)
		t.Logf("%s: %v", what, err)
	}
	refused("no client certificate", storeopen.NATSAuth{CAFile: files.CA})
	other := testkit.MakeTLSFiles(t) // another CA, which the server does not trust
	refused("a client certificate of another CA", storeopen.NATSAuth{CAFile: files.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey})

	// The server's certificate checked against another CA: not trusted,
	// whatever the client presents.
	_, err = o.NATS(ctx, url, storeopen.NATSAuth{CAFile: other.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey})
	if err == nil || !strings.Contains(err.Error(), "-nats-ca") {
		t.Fatalf("the server's certificate checked against another CA: %v, want a hint at -nats-ca", err)
	}
	noSecret(t, "another CA", err)
}
