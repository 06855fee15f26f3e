package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// unit is the real-time unit of the model (storetest.RunModel), which
// judges each answer by the interval its call took and so needs no
// margin against a busy machine. The conformance suite moves the
// records' time itself (serverTime) and sleeps through nothing.
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

// startRedis starts a redis-server of its own (see testkit.StartRedis).
func startRedis(t testing.TB, args ...string) string {
	t.Helper()
	return testkit.StartRedis(t, args...)
}

// startCluster starts a Redis Cluster of three masters on loopback (see
// testkit.StartRedisCluster) and returns a client for it, closed when t
// ends.
func startCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testkit.StartRedisCluster(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	if err := cc.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("cluster client: %v", err)
	}
	return cc
}
