package testkit

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TLSFiles are the PEM files of a private certificate authority and of
// the certificates it signed, which MakeTLSFiles made for one test.
type TLSFiles struct {
	Dir string

	CA string // the authority's certificate

	// ServerCert and ServerKey: a server certificate for 127.0.0.1 and
	// localhost.
	ServerCert, ServerKey string

	// ClientCert and ClientKey: a client certificate, for a server that
	// asks for one.
	ClientCert, ClientKey string
}

// MakeTLSFiles makes a certificate authority and a server and a client
// certificate it signs, with openssl, in t.TempDir(). Without openssl on
// $PATH the test fails naming it (see Unavailable).
func MakeTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		Unavailable(t, "openssl (to make test certificates)", "$PATH", err)
	}
	dir := t.TempDir()
	f := &TLSFiles{
		Dir:        dir,
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client.key"),
	}
	caKey := filepath.Join(dir, "ca.key")
	openssl := func(args ...string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	newKey := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"}
	openssl(append(append([]string{"req", "-x509", "-new"}, newKey...), "-keyout", caKey, "-out", f.CA, "-days", "2", "-subj", "/CN=watermill-dedup test CA")...)
	sign := func(name, cert, key, ext string) {
		t.Helper()
		csr, extFile := filepath.Join(dir, name+".csr"), filepath.Join(dir, name+".ext")
		if err := os.WriteFile(extFile, []byte(ext), 0o600); err != nil {
			t.Fatal(err)
		}
		openssl(append(append([]string{"req", "-new"}, newKey...), "-keyout", key, "-out", csr, "-subj", "/CN="+name)...)
		serial := make([]byte, 8)
		_, _ = rand.Read(serial)
		openssl("x509", "-req", "-in", csr, "-CA", f.CA, "-CAkey", caKey, "-set_serial", "0x"+hex.EncodeToString(serial),
			"-out", cert, "-days", "2", "-extfile", extFile)
	}
	sign("localhost", f.ServerCert, f.ServerKey, "subjectAltName = IP:127.0.0.1, DNS:localhost\nextendedKeyUsage = serverAuth\n")
	sign("dedup-client", f.ClientCert, f.ClientKey, "extendedKeyUsage = clientAuth\n")
	return f
}

// ClientConfig is a client's TLS configuration that trusts the files'
// authority, with the client certificate when withCert is set.
func (f *TLSFiles) ClientConfig(t testing.TB, withCert bool) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", f.CA)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}
