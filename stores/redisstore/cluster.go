package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Routing: which node of a Cluster or a Ring serves a key, and every node.

// nodeAddr is the address of the node (master, shard) that serves key,
// "" when the client cannot say.
func nodeAddr(ctx context.Context, client redis.UniversalClient, key string) string {
	var (
		n   *redis.Client
		err error
	)
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		n, err = c.MasterForKey(ctx, key)
	case *redis.Ring:
		n, err = c.GetShardClientForKey(key)
	}
	if err != nil || n == nil {
		return ""
	}
	return n.Options().Addr
}

// nodeFor returns the client of the node (master) that serves key.
func nodeFor(ctx context.Context, client redis.UniversalClient, key string) (*redis.Client, error) {
	switch c := client.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Ring:
		return c.GetShardClientForKey(key)
	}
	return nil, fmt.Errorf("redisstore: WaitReplicas with a %T", client) // New refuses it
}

// forEachNode runs check on every node the client talks to (every master
// and replica in Redis Cluster), concurrently where the client does.
func forEachNode(ctx context.Context, client redis.UniversalClient, check func(ctx context.Context, addr string, c redis.Cmdable) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return check(ctx, n.Options().Addr, n)
		})
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return check(ctx, n.Options().Addr, n)
		})
	case *redis.Client:
		return check(ctx, c.Options().Addr, c)
	default:
		return check(ctx, "redis", c)
	}
}

// reloadSlots has a ClusterClient read its slot map again, in the
// background.
func reloadSlots(ctx context.Context, client redis.UniversalClient) {
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}
