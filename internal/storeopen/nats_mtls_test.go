package storeopen_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// TestNATSClientCert: a server that requires TLS with a client
// certificate its CA signed (tls { verify: true }) and a user: the
// connection works with -nats-cert and -nats-key (and the CA); without
// the certificate, or with one another CA signed, it is refused with a
// hint at -nats-cert and -nats-key, and no error shows the password.
func TestNATSClientCert(t *testing.T) {
	files := testkit.MakeTLSFiles(t)
	conf := "tls {\n  cert_file: \"" + files.ServerCert + "\"\n  key_file: \"" + files.ServerKey + "\"\n  ca_file: \"" + files.CA + "\"\n  verify: true\n}\n" +
		"authorization {\n  users = [\n    {user: alice, password: \"" + natsPassword + "\"}\n  ]\n}\n"
	addr := testkit.StartNATSSecure(t, conf, nats.UserInfo("alice", natsPassword), nats.RootCAs(files.CA), nats.ClientCert(files.ClientCert, files.ClientKey))
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
