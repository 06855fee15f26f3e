package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

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
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("agePrefix: unsupported client %T", client)
	}
	if err != nil {
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
