package natstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// NATS servers a test starts itself, on loopback ports of their own:
// one server configured for one test (a small max_payload), or a
// JetStream cluster whose servers the test kills, pauses and restarts.
// StartNATS, StartNATSSecure and StartNATSCluster run the nats-server on
// $PATH (Debian's); without it the test fails naming it (see
// Unavailable). A NATSBin's Start and StartCluster run another
// executable: CurrentNATS builds the current release (natscurrent.go).

// NATSServer is a nats-server process of a test's own, with JetStream
// kept in a directory of its own under t.TempDir() (kept across
// restarts). Kill, Pause, Resume, Stop and Start act on it by its PID;
// it is killed (SIGKILL, by PID) when the test ends, whatever state it
// is in, the test failed or not.
type NATSServer struct {
	// Name is its server_name, the name JetStream's stream info gives
	// its leader and replicas (StreamInfo.Cluster.Leader).
	Name string
	// Port is its client port, ClusterPort its route port (0 for a
	// server outside a cluster).
	Port, ClusterPort int
	// Dir holds its config, its log and its JetStream store.
	Dir string

	t       testing.TB
	bin     string        // the nats-server executable
	cluster string        // cluster name; "" outside a cluster
	routes  []int         // the other servers' route ports
	ready   []nats.Option // the options of the client that checks it is up

	mu     sync.Mutex
	extra  string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	paused bool
}

// StartNATS starts a nats-server with JetStream on a free loopback port,
// with the config lines extra (such as "max_payload: 8192"), and returns
// it once JetStream answers. It is killed when t ends.
func StartNATS(t testing.TB, extra string) *NATSServer {
	t.Helper()
	return SystemNATS(t).Start(t, extra)
}

// Start starts a nats-server of b with JetStream on a free loopback
// port, with the config lines extra, and returns it once JetStream
// answers, to a client with the options ready (a secured server's
// credentials) when given. It is killed when t ends. See StartNATS.
func (b NATSBin) Start(t testing.TB, extra string, ready ...nats.Option) *NATSServer {
	t.Helper()
	return startNATS(t, b, extra, ready)
}

// StartNATSSecure starts a nats-server of the test's own with JetStream
// on a free loopback port, configured with the lines conf (users and
// their permissions, a token, TLS: whatever a test of credentials
// needs), and returns its address (127.0.0.1:port) once a client
// connecting with ready (the options of a user the config lets in, and
// TLS if it asks for it) gets an answer to a JetStream request. A
// server that refuses that client (its credentials, or its TLS) fails
// the test at once. The server is killed by its PID when t ends.
func StartNATSSecure(t testing.TB, conf string, ready ...nats.Option) string {
	t.Helper()
	return startNATS(t, SystemNATS(t), conf, ready).Addr()
}

// startNATS starts a server outside a cluster, with the config lines
// extra, and returns it once a client with the options ready gets an
// answer to a JetStream request.
func startNATS(t testing.TB, bin NATSBin, extra string, ready []nats.Option) *NATSServer {
	t.Helper()
	var err error
	for range 5 {
		s := newNATSServer(t, bin, "nats-0", testkit.FreePort(t), 0, "", nil, extra)
		s.ready = ready
		if err = s.start(); err == nil {
			if err = s.waitJetStream(time.Minute); err == nil {
				return s
			}
		}
		s.kill()
		if errors.Is(err, errClientRefused) {
			t.Fatalf("nats-server on %s: %v", s.Addr(), err)
		}
		// The port may have been taken meanwhile: try another.
	}
	t.Fatalf("could not start nats-server: %v", err)
	return nil
}

// NATSCluster is a JetStream cluster of nats-server processes of a
// test's own (StartNATSCluster).
type NATSCluster struct {
	Servers []*NATSServer
}

// StartNATSCluster starts n nats-servers (n ≥ 1; 3 or 5 for replicated
// streams) with JetStream, routed to each other as one cluster, each on
// loopback ports of its own, with the config lines extra, and returns
// them once every server answers JetStream requests and the cluster
// places a stream of n replicas (its meta leader knows every peer). Their names are n0, n1, …; each is killed
// when t ends.
func StartNATSCluster(t testing.TB, n int, extra string) *NATSCluster {
	t.Helper()
	return SystemNATS(t).StartCluster(t, n, extra)
}

// StartCluster starts a JetStream cluster of n nats-servers of b: see
// StartNATSCluster.
func (b NATSBin) StartCluster(t testing.TB, n int, extra string) *NATSCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("StartNATSCluster: %d servers", n)
	}
	var err error
	for range 3 {
		ports := make([]int, n)
		for i := range ports {
			for {
				// FreePort checks port+10000 as well: the route port.
				ports[i] = testkit.FreePort(t)
				if !containsPort(ports[:i], ports[i]) {
					break
				}
			}
		}
		c := &NATSCluster{}
		name := testkit.UniqueName("testkit_")
		for i, p := range ports {
			var routes []int
			for j, q := range ports {
				if j != i {
					routes = append(routes, q+10000)
				}
			}
			c.Servers = append(c.Servers, newNATSServer(t, b, "n"+strconv.Itoa(i), p, p+10000, name, routes, extra))
		}
		err = nil
		for _, s := range c.Servers {
			if err = s.start(); err != nil {
				break
			}
		}
		for _, s := range c.Servers {
			if err != nil {
				break
			}
			err = s.waitJetStream(60 * time.Second)
		}
		if err == nil && n > 1 {
			err = c.waitPeers(60 * time.Second)
		}
		if err == nil {
			return c
		}
		for _, s := range c.Servers {
			s.kill() // a port may have been taken meanwhile: try others
		}
	}
	t.Fatalf("could not start a cluster of %d nats-servers: %v", n, err)
	return nil
}

// waitPeers waits until the cluster's meta group places a stream on
// every server: each answering JetStream requests is not enough, a
// stream of n replicas created then can still fail with "no suitable
// peers for placement" (10005) while the meta leader learns of the
// others. It creates and deletes a stream of n replicas.
func (c *NATSCluster) waitPeers(timeout time.Duration) error {
	nc, err := nats.Connect(c.URL(), append([]nats.Option{nats.Timeout(2 * time.Second)}, c.Servers[0].ready...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	name := testkit.UniqueName("testkit_peers_")
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Replicas: len(c.Servers), Storage: jetstream.MemoryStorage})
		if err == nil {
			err = js.DeleteStream(ctx, name)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster does not place a stream on its %d servers after %s: %w", len(c.Servers), timeout, err)
		}
	}
}

// URLs are the client URLs of the servers, in order.
func (c *NATSCluster) URLs() []string {
	out := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = s.URL()
	}
	return out
}

// URL is every server's URL, comma-separated, as nats.Connect takes a
// server list.
func (c *NATSCluster) URL() string { return strings.Join(c.URLs(), ",") }

// Index returns the index of the server named name, or -1.
func (c *NATSCluster) Index(name string) int {
	for i, s := range c.Servers {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func containsPort(ports []int, p int) bool {
	for _, q := range ports {
		if q == p || q+10000 == p || p+10000 == q {
			return true
		}
	}
	return false
}

func newNATSServer(t testing.TB, bin NATSBin, name string, port, clusterPort int, cluster string, routes []int, extra string) *NATSServer {
	s := &NATSServer{Name: name, Port: port, ClusterPort: clusterPort, Dir: t.TempDir(), t: t, bin: bin.Path, cluster: cluster, routes: routes, extra: extra}
	// Registered after t.TempDir's own cleanup, so it runs before the
	// directory is removed.
	t.Cleanup(s.kill)
	return s
}

// URL is the server's client URL.
func (s *NATSServer) URL() string { return "nats://" + s.Addr() }

// Addr is the server's client address, 127.0.0.1:port.
func (s *NATSServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// LogPath is the file the server logs to (kept across restarts).
func (s *NATSServer) LogPath() string { return filepath.Join(s.Dir, "nats.log") }

// Log returns the server's log lines that contain any of words (every
// line when words is empty), across its restarts.
func (s *NATSServer) Log(words ...string) []string {
	b, err := os.ReadFile(s.LogPath())
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if len(words) == 0 || containsAny(line, words) {
			out = append(out, line)
		}
	}
	return out
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// SetConfig replaces the extra config lines the server starts with
// next (Start).
func (s *NATSServer) SetConfig(extra string) {
	s.mu.Lock()
	s.extra = extra
	s.mu.Unlock()
}

// PID is the server's process id, 0 when it is not running.
func (s *NATSServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process is running (paused or not).
func (s *NATSServer) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Start starts the server again after Kill or Stop (same name, ports,
// store and config; SetConfig changes the config), and waits until it
// answers JetStream requests: for a server of a cluster, until it is
// routed to a cluster that has a meta leader. It fails the test when
// the server does not come up within a minute.
func (s *NATSServer) Start() {
	s.t.Helper()
	if s.Running() {
		s.t.Fatalf("nats-server %s is running already", s.Name)
	}
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
	if err := s.waitJetStream(time.Minute); err != nil {
		s.t.Fatal(err)
	}
}

// Kill kills the server (SIGKILL, a crash: nothing is flushed) and
// waits for it to exit. A paused server is killed too.
func (s *NATSServer) Kill() { s.kill() }

// Stop shuts the server down gracefully (SIGTERM) and waits for it to
// exit; after 30s it kills it.
func (s *NATSServer) Stop() {
	s.mu.Lock()
	cmd, exited, paused := s.cmd, s.exited, s.paused
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
	}
	s.kill()
}

// Pause stops the process (SIGSTOP), and returns once it has stopped:
// it keeps its connections open (the kernel even accepts new ones) but
// answers nothing, as a hung server or a long GC pause.
func (s *NATSServer) Pause() {
	s.signal(syscall.SIGSTOP, true)
	testkit.WaitStopped(s.PID())
}

// Resume continues a paused process (SIGCONT).
func (s *NATSServer) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *NATSServer) signal(sig syscall.Signal, paused bool) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("nats-server %s is not running", s.Name)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("nats-server %s: %v: %v", s.Name, sig, err)
	}
	s.paused = paused
}

// kill kills the process by its PID, if it runs, and waits for it.
func (s *NATSServer) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.paused = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill() // SIGKILL ends a stopped process as well
	<-exited
}

// config is the server's config file's text.
func (s *NATSServer) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n}\n", s.Name, s.Port, filepath.Join(s.Dir, "js"))
	if s.cluster != "" {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  routes: [\n", s.cluster, s.ClusterPort)
		for _, p := range s.routes {
			fmt.Fprintf(&b, "    nats-route://127.0.0.1:%d\n", p)
		}
		b.WriteString("  ]\n}\n")
	}
	b.WriteString(s.extra)
	b.WriteString("\n")
	return b.String()
}

// start writes the config and starts the process.
func (s *NATSServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	conf := filepath.Join(s.Dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(s.config()), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "-c", conf, "-l", s.LogPath())
	testkit.SetPdeathsig(cmd) // a test binary that dies (a timeout) takes its servers along
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting nats-server %s: %w", s.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited, s.paused = cmd, exited, false
	return nil
}

// errClientRefused marks a server that refused the client checking it is
// up: its credentials or its TLS. Waiting would not help.
var errClientRefused = errors.New("the server refused the client that checks it is up")

// waitJetStream waits until the server answers a JetStream request
// (account info) of a client with the options s.ready, or exits, or
// refuses that client (errClientRefused).
func (s *NATSServer) waitJetStream(timeout time.Duration) error {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	opts := append([]nats.Option{nats.Timeout(2 * time.Second), nats.NoReconnect()}, s.ready...)
	var err error
	for deadline := time.Now().Add(timeout); ; {
		var nc *nats.Conn
		nc, err = nats.Connect(s.URL(), opts...)
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
		if refusesClient(err) {
			return fmt.Errorf("%w: %w", errClientRefused, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("nats-server %s (port %d) exited: %v; its log ends:\n%s", s.Name, s.Port, err, strings.Join(testkit.LastLines(s.Log(), 10), "\n"))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server %s on %s does not answer JetStream requests after %s: %w", s.Name, s.URL(), timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// refusesClient tells a refusal of the client's credentials or of its
// TLS (an untrusted certificate, a client certificate missing) from a
// server not up yet. nats.go does not wrap every one of them.
func refusesClient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrSecureConnRequired) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "uthorization") || strings.Contains(msg, "x509") || strings.Contains(msg, "remote error: tls")
}
