package redistest

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

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// StartRedisTLS starts a redis-server of its own that speaks TLS only
// (--port 0 --tls-port), with certificates MakeTLSFiles made, on a free
// loopback port, with extra arguments; with clientCerts it requires a
// client certificate (--tls-auth-clients yes). It kills the server when t
// ends, and returns its address and the files once it answers PING over
// TLS. A redis-server built without TLS fails the test, naming it (see
// Unavailable).
func StartRedisTLS(t testing.TB, clientCerts bool, args ...string) (string, *testkit.TLSFiles) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testkit.Unavailable(t, "redis-server (to start test Redis nodes)", "$PATH", err)
	}
	files := testkit.MakeTLSFiles(t)
	auth := "no"
	if clientCerts {
		auth = "yes"
	}
	ping := redis.Options{TLSConfig: files.ClientConfig(t, clientCerts), MaxRetries: -1, DialTimeout: 200 * time.Millisecond}
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		port := testkit.FreePort(t)
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
		testkit.SetPdeathsig(cmd) // a test binary that dies (a timeout) takes its server along
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
			testkit.Unavailable(t, "redis-server built with TLS (BUILD_TLS=yes)", bin, fmt.Errorf("%s rejects --tls-port: %s", bin, strings.TrimSpace(out)))
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
