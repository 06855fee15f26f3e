package testkit

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
)

// Redis servers a test starts itself, on loopback ports of their own:
// servers configured for one test (an eviction policy, a renamed
// command) and Redis Clusters. They need redis-server (and redis-cli for
// a cluster) on $PATH; without them the test skips loudly, or fails when
// services are required.

// StartRedis starts a redis-server of its own on a free loopback port
// with extra arguments, in a temporary directory, and kills it when t
// ends. It returns the address once the server answers PING.
func StartRedis(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server (to start test Redis nodes)", "$PATH", err)
	}
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

// StartRedisCluster starts a Redis Cluster of three masters (no
// replicas) on loopback, from redis-server processes it kills when t
// ends, and returns their addresses once every node has every slot and
// agrees the cluster is up.
func StartRedisCluster(t testing.TB) []string {
	t.Helper()
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = StartRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+UniqueName("")+".conf",
			"--cluster-node-timeout", "5000")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(t, "redis-cli (to create the test Redis Cluster)", "$PATH", err)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node agrees, so a client's first slot map is the
	// final one.
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
	return addrs
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
