package natstest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// Reload replaces the server's extra config lines with extra, as
// SetConfig does, and has the running server reload its config file
// (SIGHUP, by its PID: what nats-server --signal reload does): its
// users, their permissions, its TLS settings change under the clients
// already connected, which keep their connections unless the new config
// refuses them. It returns once the server logged the reload, and fails
// the test when it logged an error instead, or nothing within a minute.
func (s *NATSServer) Reload(extra string) {
	s.t.Helper()
	s.SetConfig(extra)
	s.mu.Lock()
	conf := s.config()
	s.mu.Unlock()
	if err := os.WriteFile(filepath.Join(s.Dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		s.t.Fatal(err)
	}
	done, failed := len(s.Log("Reloaded server configuration")), len(s.Log("Failed to reload"))
	s.signal(syscall.SIGHUP, false)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		switch {
		case len(s.Log("Reloaded server configuration")) > done:
			return
		case len(s.Log("Failed to reload")) > failed:
			s.t.Fatalf("nats-server %s did not reload its config: %v", s.Name, testkit.LastLines(s.Log("Failed to reload"), 1))
		case time.Now().After(deadline):
			s.t.Fatalf("nats-server %s did not log a reload a minute after SIGHUP", s.Name)
		}
	}
}

// StartNATSSecureServer is StartNATSSecure returning the server itself,
// for a test that reloads its config (Reload), stops or restarts it.
func StartNATSSecureServer(t testing.TB, conf string, ready ...nats.Option) *NATSServer {
	t.Helper()
	return startNATS(t, SystemNATS(t), conf, ready)
}
