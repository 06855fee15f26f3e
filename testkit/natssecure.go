package testkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StartNATSSecure starts a nats-server of the test's own with JetStream
// on a free loopback port, configured with the lines conf (users and
// their permissions, a token, TLS: whatever a test of credentials
// needs), and returns its address (127.0.0.1:port) once a client
// connecting with ready (the options of a user the config lets in, and
// TLS if it asks for it) gets an answer to a JetStream request. The
// server is killed by its PID when t ends. It needs nats-server on
// $PATH; without it the test skips loudly, or fails when services are
// required.
func StartNATSSecure(t testing.TB, conf string, ready ...nats.Option) string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		Unavailable(t, "nats-server (to start a NATS server of the test's own)", "$PATH", err)
	}
	dir := t.TempDir()
	for range 5 {
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		path := filepath.Join(dir, "nats.conf")
		text := fmt.Sprintf("listen: %s\njetstream {\n  store_dir: %q\n}\n%s\n", addr, filepath.Join(dir, "js"), conf)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		log := filepath.Join(dir, "nats.log")
		cmd := exec.Command(bin, "-c", path, "-l", log)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting nats-server: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill() // by its PID
			<-exited
		})
		if err = waitNATSReady(addr, exited, ready); err == nil {
			return addr
		}
		select {
		case <-exited: // the port may have been taken meanwhile: try another
			b, _ := os.ReadFile(log)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			err = fmt.Errorf("%w; its log ends:\n%s", err, strings.Join(lines[max(len(lines)-10, 0):], "\n"))
		default:
			t.Fatalf("nats-server on %s: %v", addr, err)
		}
	}
	t.Fatalf("could not start nats-server: %v", err)
	return ""
}

// waitNATSReady waits until a client connecting to addr with opts gets
// an answer to a JetStream request, or the server exits. A server that
// refuses the client's credentials, or its TLS, fails at once: waiting
// would not help.
func waitNATSReady(addr string, exited <-chan struct{}, opts []nats.Option) error {
	scheme := "nats://"
	for deadline := time.Now().Add(time.Minute); ; {
		nc, err := nats.Connect(scheme+addr, append([]nats.Option{nats.Timeout(2 * time.Second), nats.NoReconnect()}, opts...)...)
		if err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return nil
			}
		}
		if err != nil && (strings.Contains(err.Error(), "uthorization") || strings.Contains(err.Error(), "x509")) {
			return fmt.Errorf("the ready client was refused: %w", err)
		}
		select {
		case <-exited:
			return fmt.Errorf("nats-server exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to JetStream requests after a minute: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
