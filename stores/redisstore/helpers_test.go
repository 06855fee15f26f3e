package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
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
	if err := onEveryMaster(ctx, client, del); err != nil {
		t.Errorf("deleting test keys under %q: %v", prefix, err)
	}
}

// onEveryMaster runs f on client, or on every master of a Redis Cluster
// client.
func onEveryMaster(ctx context.Context, client redis.UniversalClient, f func(context.Context, *redis.Client) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, f)
	case *redis.Client:
		return f(ctx, c)
	}
	return fmt.Errorf("unsupported client %T", client)
}

// proxiedClient returns a TCP proxy to addr and a client through it on
// opts (Addr the proxy's, ContextTimeoutEnabled), closed when t ends.
func proxiedClient(t testing.TB, addr string, opts redis.Options) (*testkit.Proxy, *redis.Client) {
	t.Helper()
	p := testkit.NewProxy(t, addr)
	opts.Addr, opts.ContextTimeoutEnabled = p.Addr(), true
	c := redis.NewClient(&opts)
	t.Cleanup(func() { _ = c.Close() })
	return p, c
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

// startRedis starts a redis-server of its own (see redistest.StartRedis).
func startRedis(t testing.TB, args ...string) string {
	t.Helper()
	return redistest.StartRedis(t, args...)
}

// startCluster starts a Redis Cluster of three masters on loopback (see
// redistest.StartRedisCluster) and returns a client for it, closed when t
// ends.
func startCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartRedisCluster(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	if err := cc.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("cluster client: %v", err)
	}
	return cc
}

// ageScript makes KEYS[1] ARGV[1] ms older: its remaining TTL shrinks by
// that much, and a key whose TTL would reach zero is deleted, as the
// server would have deleted it. A key without a TTL, or none, is left
// alone. Reply: the key's remaining TTL in ms afterwards (-2: no key).
var ageScript = redis.NewScript(`
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then
  return pttl
end
local left = pttl - tonumber(ARGV[1])
if left > 0 then
  redis.call('PEXPIRE', KEYS[1], left)
  return left
end
redis.call('DEL', KEYS[1])
return -2
`)

// age lets d pass for the records of rkeys, as far as the store can
// tell: the store keeps no time of its own but each record's TTL (a
// lease is live while PTTL > lease, a done record lives until its TTL
// runs out, an undo puts back what was left of a TTL), so shrinking
// every TTL by d is d passing on the server's clock. Tests use leases
// of minutes or hours, which run out only when a test ages the record
// past them, never because the machine was slow. One call per key, so
// that Redis Cluster sees no CROSSSLOT.
func age(t testing.TB, c redis.UniversalClient, d time.Duration, rkeys ...string) {
	t.Helper()
	ms := strconv.FormatInt(d.Milliseconds(), 10)
	for _, k := range rkeys {
		if err := ageScript.Run(context.Background(), c, []string{k}, ms).Err(); err != nil {
			t.Fatalf("ageing %q by %s: %v", k, d, err)
		}
	}
}

// agePrefix ages every key under prefix by d (see age), on every master
// of a Redis Cluster.
func agePrefix(t testing.TB, client redis.UniversalClient, prefix string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, redisstore.GlobEscape(prefix)+"*", 1000).Iterator()
		var keys []string
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		if err := it.Err(); err != nil {
			return err
		}
		age(t, c, d, keys...)
		return nil
	}
	if err := onEveryMaster(ctx, client, scan); err != nil {
		t.Fatalf("ageing the keys under %q: %v", prefix, err)
	}
}

// serverTime is the conformance suite's way to move time for stores on
// client: it ages every record of the store (see age), so the suite's
// leases and retentions run out only when it says, never because the
// machine was slow (storetest.ServerTime).
func serverTime(client redis.UniversalClient) storetest.Option {
	return storetest.ServerTime(func(t testing.TB, s stores.Store, d time.Duration) {
		agePrefix(t, client, s.(*redisstore.Store).Prefix(), d)
	})
}

// claimResult is the answer of a Claim.
type claimResult struct {
	c   *stores.Claim
	err error
}

// claimAsync claims keys of scope on s in a goroutine of its own, and
// returns where its answer arrives.
func claimAsync(ctx context.Context, s stores.Store, scope string, keys ...string) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(ctx, scope, keys, time.Minute)
		done <- claimResult{c, err}
	}()
	return done
}

// slotPrefix returns a prefix whose keys all hash to one slot of the
// cluster, that slot, and its owner.
func slotPrefix(t testing.TB, cc *redis.ClusterClient) (prefix string, slot int64, owner *redis.Client) {
	t.Helper()
	ctx := context.Background()
	prefix = "{" + storetest.NewID() + "}:"
	slot, err := cc.ClusterKeySlot(ctx, prefix).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner, err = cc.MasterForKey(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return prefix, slot, owner
}
