package redistest

import (
	"context"
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

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// Redis servers a test starts itself, on loopback ports of their own:
// servers configured for one test (an eviction policy, a renamed
// command) and Redis Clusters. They need redis-server (and redis-cli for
// a cluster) on $PATH; without them the test fails naming them (see
// Unavailable).

// StartRedis starts a redis-server of its own on a free loopback port
// with extra arguments, in a temporary directory, and kills it when t
// ends. It returns the address once the server answers PING.
func StartRedis(t testing.TB, args ...string) string {
	t.Helper()
	return startRedisServer(t, args...).Addr
}

// RedisServer is a redis-server process of a test's own, on a loopback
// port and in a directory of its own (kept across restarts: a cluster
// node finds its nodes.conf there again). Kill and Start act on it by
// its PID; it is killed (SIGKILL, by PID) when the test ends, whatever
// state it is in.
type RedisServer struct {
	// Addr is its host:port on loopback.
	Addr string
	// Port is its port (its cluster bus is Port+10000).
	Port int
	// Dir holds its files and its log.
	Dir string

	t    testing.TB
	bin  string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// startRedisServer starts a redis-server as StartRedis does, and returns
// it for the test to kill and start again.
func startRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testkit.Unavailable(t, "redis-server (to start test Redis nodes)", "$PATH", err)
	}
	s, err := launchRedis(bin, t.TempDir(), args)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	t.Cleanup(s.Kill)
	return s
}

// LaunchRedisReplicated is StartRedisReplicated for a program (the
// bench): it starts the servers in dir and returns them, or an error
// having killed the ones it started. The caller kills them (Kill) when
// done; Start, Pause and Resume are for tests only.
func LaunchRedisReplicated(dir string, n int, args ...string) ([]*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed: %w", err)
	}
	var servers []*RedisServer
	fail := func(err error) ([]*RedisServer, error) {
		for _, s := range servers {
			s.Kill()
		}
		return nil, err
	}
	for i, args := range replicatedArgs(n, args) {
		if i > 0 {
			args = append(args[:len(args):len(args)], strconv.Itoa(servers[0].Port))
		}
		s, err := launchRedis(bin, filepath.Join(dir, strconv.Itoa(i)), args)
		if err != nil {
			return fail(err)
		}
		servers = append(servers, s)
	}
	if err := waitRedisReplicas(context.Background(), servers[0].Addr, n, time.Minute); err != nil {
		return fail(err)
	}
	return servers, nil
}

// replicatedArgs are the arguments of a primary and n replicas (each to
// be followed by the primary's port).
func replicatedArgs(n int, args []string) [][]string {
	// A replica's sync starts at once, not after the default 5s wait for
	// more replicas to share it.
	args = append([]string{"--repl-diskless-sync-delay", "0"}, args...)
	all := [][]string{args}
	for range n {
		all = append(all, append(args[:len(args):len(args)], "--replicaof", "127.0.0.1"))
	}
	return all
}

// launchRedis starts bin (redis-server) with args on a free loopback
// port, in dir, and returns it once it answers PING.
func launchRedis(bin, dir string, args []string) (*RedisServer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := testkit.FreePortPair()
		if err != nil {
			return nil, err
		}
		s := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, bin: bin}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--logfile", filepath.Join(dir, strconv.Itoa(port)+".log"),
			"--daemonize", "no",
		}, args...)
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
		// The port was taken meanwhile: try another.
	}
	return nil, fmt.Errorf("could not start redis-server: %w", lastErr)
}

// start runs the server and waits until it answers PING; on failure it
// leaves nothing running.
func (s *RedisServer) start() error {
	cmd := exec.Command(s.bin, s.args...)
	testkit.SetPdeathsig(cmd) // a test binary that dies (a timeout) takes its servers along
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	if err := waitPing(s.Addr, errc); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// PID is the process id of the running server, 0 when it is not
// running.
func (s *RedisServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	select {
	case <-s.exited:
		return 0
	default:
		return s.cmd.Process.Pid
	}
}

// Kill sends SIGKILL to the server's process, by its PID, and waits
// until it has exited. Killing a server that is not running does
// nothing.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill() // by PID; an exited process is not signalled
	<-exited
}

// Pause stops the server's process (SIGSTOP, by its PID): it holds its
// connections and answers nothing, as a hung server does, until Resume.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT, by its PID).
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *RedisServer) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if pid := s.PID(); pid == 0 || cmd.Process.Signal(sig) != nil {
		s.t.Fatalf("redis-server on %s is not running: cannot send it %v", s.Addr, sig)
	}
}

// Start starts a killed server again, with the same port, arguments and
// directory, and waits until it answers PING (another process taking
// its port meanwhile fails the test).
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.PID() != 0 {
		s.t.Fatalf("redis-server on %s is already running", s.Addr)
	}
	var err error
	for range 20 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port is released a little after the kill
	}
	s.t.Fatalf("starting redis-server on %s again: %v", s.Addr, err)
}

// StartRedisReplicated starts a redis-server (with args) and n replicas
// of it (replicaof), each of its own as startRedisServer starts them,
// and returns them, the primary first, once every replica is in sync.
func StartRedisReplicated(t testing.TB, n int, args ...string) []*RedisServer {
	t.Helper()
	var servers []*RedisServer
	for i, args := range replicatedArgs(n, args) {
		if i > 0 {
			args = append(args, strconv.Itoa(servers[0].Port))
		}
		servers = append(servers, startRedisServer(t, args...))
	}
	primary := servers[0]
	if err := waitRedisReplicas(context.Background(), primary.Addr, n, time.Minute); err != nil {
		t.Fatal(err)
	}
	return servers
}

// waitRedisReplicas waits until the server at addr has n replicas
// connected and past their first sync (state=online), or timeout passes.
func waitRedisReplicas(ctx context.Context, addr string, n int, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Count(info, "state=online") >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s has not %d replicas online after %s: %v\n%s", addr, n, timeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RedisClusterOption configures StartRedisCluster.
type RedisClusterOption func(*redisClusterConfig)

type redisClusterConfig struct {
	replicas    int
	nodeTimeout time.Duration
}

// ClusterReplicas gives each of the three masters n replicas (default
// none).
func ClusterReplicas(n int) RedisClusterOption {
	return func(c *redisClusterConfig) { c.replicas = n }
}

// ClusterNodeTimeout sets cluster-node-timeout (default 5s): how long a
// master may not answer before its replicas fail it over.
func ClusterNodeTimeout(d time.Duration) RedisClusterOption {
	return func(c *redisClusterConfig) { c.nodeTimeout = d }
}

// StartRedisCluster starts a Redis Cluster of three masters (and, with
// ClusterReplicas, their replicas) on loopback, from redis-server
// processes it kills when t ends, and returns their addresses (the
// masters' first) once every node has every slot, every replica is in
// sync and every node agrees the cluster is up.
func StartRedisCluster(t testing.TB, opts ...RedisClusterOption) []string {
	t.Helper()
	nodes := StartRedisClusterServers(t, opts...)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// StartRedisClusterServers starts a Redis Cluster as StartRedisCluster
// does, and returns its servers (the masters' first), for the test to
// kill and start again.
func StartRedisClusterServers(t testing.TB, opts ...RedisClusterOption) []*RedisServer {
	t.Helper()
	cfg := redisClusterConfig{nodeTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	nodes := make([]*RedisServer, 3*(1+cfg.replicas))
	addrs := make([]string, len(nodes))
	for i := range nodes {
		nodes[i] = startRedisServer(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+testkit.UniqueName("")+".conf",
			"--cluster-node-timeout", strconv.FormatInt(cfg.nodeTimeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0") // a replica (re)joining syncs at once
		addrs[i] = nodes[i].Addr
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testkit.Unavailable(t, "redis-cli (to create the test Redis Cluster)", "$PATH", err)
	}
	// redis-cli makes the first three nodes the masters.
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(cfg.replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node agrees, so a client's first slot map is the
	// final one, and every replica is in sync with its master.
	if err := waitRedisClusterOK(context.Background(), addrs, 3*cfg.replicas, time.Minute); err != nil {
		t.Fatal(err)
	}
	return nodes
}

// waitRedisClusterOK waits until every node of addrs reports the cluster
// ok with every slot assigned and every node of addrs known, and (with
// replicas > 0) until that many replicas have their link to their
// master up and have finished their first sync, or timeout passes.
func waitRedisClusterOK(ctx context.Context, addrs []string, replicas int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		last = RedisClusterNotOK(ctx, addrs, replicas)
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster %v not ok after %s: %s", addrs, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RedisClusterNotOK returns why the cluster of addrs is not ok yet (see
// waitRedisClusterOK), or "" when it is.
func RedisClusterNotOK(ctx context.Context, addrs []string, replicas int) string {
	known := "cluster_known_nodes:" + strconv.Itoa(len(addrs))
	synced := 0
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
		info, err := c.ClusterInfo(ctx).Result()
		var repl string
		if err == nil {
			repl, err = c.Info(ctx, "replication").Result()
		}
		_ = c.Close()
		if err != nil {
			return fmt.Sprintf("node %s: %v", a, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") || !strings.Contains(info, known) {
			return fmt.Sprintf("node %s: %s", a, strings.Join(strings.Fields(info)[:min(6, len(strings.Fields(info)))], " "))
		}
		if strings.Contains(repl, "role:slave") {
			if !strings.Contains(repl, "master_link_status:up") || !strings.Contains(repl, "master_sync_in_progress:0") {
				return fmt.Sprintf("replica %s not in sync with its master", a)
			}
			synced++
		}
	}
	if synced != replicas {
		return fmt.Sprintf("%d replicas in sync, want %d", synced, replicas)
	}
	return ""
}

// waitPing waits until a server started at addr answers PING, or exits.
func waitPing(addr string, exited <-chan error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on %s exited: %v", addr, err)
		default:
		}
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
