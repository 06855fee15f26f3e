package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
	"github.com/watermill-dedup/dedup/testkit"
)

// unit is the real-time unit of the conformance suite: leases and
// retention are 4 units. Redis keeps time to the millisecond; the unit only
// has to dwarf scheduling noise under -race on a busy two-core machine.
const unit = 200 * time.Millisecond

// newClient returns a client for addr, closed by t.Cleanup.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testPrefix returns a prefix no other test uses, and deletes every key
// under it when t ends. Tests never FLUSHDB the shared Redis.
func testPrefix(t testing.TB, client redis.UniversalClient) string {
	t.Helper()
	p := "dedup-test-" + storetest.NewID() + ":"
	t.Cleanup(func() { deletePrefix(t, client, p) })
	return p
}

// deletePrefix SCANs for the keys under prefix on every node and UNLINKs
// them, one key per command so that Cluster never sees a CROSSSLOT.
func deletePrefix(t testing.TB, client redis.UniversalClient, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			})
			batch = batch[:0]
			return err
		}
		for it.Next(ctx) {
			batch = append(batch, it.Val())
			if len(batch) == 1000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, del)
	case *redis.Client:
		err = del(ctx, c)
	default:
		err = fmt.Errorf("deletePrefix: unsupported client %T", client)
	}
	if err != nil {
		t.Errorf("deleting test keys under %q: %v", prefix, err)
	}
}

// countPrefix returns how many keys exist under prefix (standalone only).
func countPrefix(t testing.TB, c *redis.Client, prefix string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// newStore returns a store on client under its own prefix, closed (but
// the client not) by t.Cleanup.
func newStore(t testing.TB, client redis.UniversalClient, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = testPrefix(t, client)
	}
	cfg.SkipServerCheck = true
	s, err := redisstore.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// factory returns a storetest factory for stores on client.
func factory(client redis.UniversalClient, cfg redisstore.Config) storetest.Factory {
	return func(t *testing.T, _ stores.Clock) stores.Store {
		return newStore(t, client, cfg)
	}
}

// requireRedisServer returns the path of redis-server, or skips loudly
// (fails under CI=1 / DEDUP_REQUIRE_SERVICES=1) when it is not installed.
func requireRedisServer(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testkit.Unavailable(t, "redis-server (to start test Redis nodes)", "$PATH", err)
	}
	return path
}

// freePort returns a loopback port that is free, as is port+10000 (the
// cluster bus port).
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(10000)
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		_ = l1.Close()
		if err != nil {
			continue
		}
		_ = l2.Close()
		return p
	}
	t.Fatal("no free loopback port pair found")
	return 0
}

// startRedis starts a redis-server of its own on a free loopback port with
// extra arguments, in a temp dir, and kills it when t ends. It returns the
// address once the server answers PING.
func startRedis(t testing.TB, args ...string) string {
	t.Helper()
	bin := requireRedisServer(t)
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		full := append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--logfile", filepath.Join(dir, strconv.Itoa(port)+".log"),
			"--daemonize", "no",
		}, args...)
		cmd := exec.Command(bin, full...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		if err := waitPing(addr, exited); err != nil {
			stop()
			lastErr = err
			continue // the port was taken meanwhile: try another
		}
		t.Cleanup(stop)
		return addr
	}
	t.Fatalf("could not start redis-server: %v", lastErr)
	return ""
}

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

// startCluster starts a Redis Cluster of three masters (no replicas) on
// loopback, from redis-server processes it kills when t ends, and returns a
// client for it.
func startCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+storetest.NewID()+".conf",
			"--cluster-node-timeout", "5000")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testkit.Unavailable(t, "redis-cli (to create the test Redis Cluster)", "$PATH", err)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node has every slot assigned and agrees the cluster
	// is up, so the client's first slot map is the final one.
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_assigned:16384") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("cluster node %s not ready: %v\n%s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	if err := cc.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("cluster client: %v", err)
	}
	return cc
}
