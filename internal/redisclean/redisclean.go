// Package redisclean deletes what a program or a test wrote to a Redis
// under a key prefix of its own.
package redisclean

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// DeletePrefix deletes the keys under prefix, and only those (SCAN
// and DEL, never FLUSHDB a shared Redis); on a cluster, on every master.
// DEL, not UNLINK: a record is a short string, which DEL frees at once as
// well, and DEL is a command the store's least-privilege ACL user has
// (stores/redisstore/README.md), so a program running as that user
// cleans up after itself.
func DeletePrefix(ctx context.Context, client redis.UniversalClient, prefix string) error {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return deletePrefix(ctx, c, prefix)
		})
	}
	return deletePrefix(ctx, client, prefix)
}

func deletePrefix(ctx context.Context, c redis.Cmdable, prefix string) error {
	const batch = 500
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	keys := make([]string, 0, batch)
	// One key per DEL: the keys of one Cluster node hash to different
	// slots, which one command may not mix (CROSSSLOT).
	unlink := func() error {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Del(ctx, k)
			}
			return nil
		})
		keys = keys[:0]
		if err != nil {
			return fmt.Errorf("delete %s*: %w", prefix, err)
		}
		return nil
	}
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == batch {
			if err := unlink(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan %s*: %w", prefix, err)
	}
	if len(keys) > 0 {
		return unlink()
	}
	return nil
}
