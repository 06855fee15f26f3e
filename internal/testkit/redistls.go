package testkit

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// StartRedisTLS starts a redis-server of its own that speaks TLS only
// (--port 0 --tls-port), with certificates MakeTLSFiles made, on a free
// loopback port, with extra arguments; with clientCerts it requires a
// client certificate (--tls-auth-clients yes). It kills the server when t
// ends, and returns its address and the files once it answers PING over
// TLS. A redis-server built without TLS fails the test, naming it (see
// Unavailable).
func StartRedisTLS(t testing.TB, clientCerts bool, args ...string) (string, *TLSFiles) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server (to start test Redis nodes)", "$PATH", err)
	}
	files := MakeTLSFiles(t)
	auth := "no"
	if clientCerts {
		auth = "yes"
	}
	ping := redis.Options{TLSConfig: files.ClientConfig(t, clientCerts), MaxRetries: -1, DialTimeout: 200 * time.Millisecond}
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		logFile := filepath.Join(dir, strconv.Itoa(port)+".log")
		full := append([]string{
			"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey,
			"--tls-ca-cert-file", files.CA, "--tls-auth-clients", auth,
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--logfile", logFile, "--daemonize", "no",
		}, args...)
		cmd := exec.Command(bin, full...)
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		// exited is closed once the process is gone (a channel that
		// a receive would drain could be waited on only once).
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		ping.Addr = addr
		err := waitTLSPing(&ping, exited)
		if err == nil {
			t.Cleanup(stop)
			return addr, files
		}
		stop()
		log, _ := os.ReadFile(logFile)
		out := stderr.String() + string(log)
		if strings.Contains(out, "tls-port") && strings.Contains(out, "Bad directive") {
			Unavailable(t, "redis-server built with TLS (BUILD_TLS=yes)", bin, fmt.Errorf("%s rejects --tls-port: %s", bin, strings.TrimSpace(out)))
		}
		lastErr = fmt.Errorf("%w\n%s", err, out)
	}
	t.Fatalf("could not start redis-server with TLS: %v", lastErr)
	return "", nil
}

// waitTLSPing waits until the server at opts.Addr answers PING, or
// exits.
func waitTLSPing(opts *redis.Options, exited <-chan struct{}) error {
	c := redis.NewClient(opts)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited", opts.Addr)
		default:
		}
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer over TLS: %v", opts.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
