package storeopen_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
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
