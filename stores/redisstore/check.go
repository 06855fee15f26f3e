package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
)

// ErrEvictionPolicy is returned by [Store.CheckServer] when a Redis node
// may evict dedup records to free memory. Every record has a TTL, so every
// policy but noeviction (volatile-* as much as allkeys-*) can drop a live
// record, and a redelivery of that message then runs its handler again.
var ErrEvictionPolicy = errors.New("redisstore: Redis maxmemory-policy may evict dedup records; set it to noeviction")

// CheckServer reads maxmemory-policy and maxmemory from every node the
// client talks to (every master and replica in Redis Cluster, since a
// replica can be promoted) and reports a node whose policy is not
// noeviction: it logs an error through Config.Logger and returns an error
// wrapping [ErrEvictionPolicy].
//
// A node where CONFIG GET is refused (renamed or disabled, as on many
// managed services, or denied by an ACL) cannot be checked: CheckServer
// logs that at Info level and does not count it as a failure. Other errors
// (the server is unreachable) are returned as they are.
//
// New runs it in the background unless Config.SkipServerCheck is set.
// After Close it returns an error wrapping stores.ErrClosed.
func (s *Store) CheckServer(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("redisstore: check server: %w", stores.ErrClosed)
	}
	var (
		mu       sync.Mutex
		evicting []string
		unknown  []string
	)
	check := func(ctx context.Context, addr string, c redis.Cmdable) error {
		cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
		var rerr redis.Error
		if errors.As(err, &rerr) {
			mu.Lock()
			unknown = append(unknown, fmt.Sprintf("%s (%v)", addr, err))
			mu.Unlock()
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		policy := cfg["maxmemory-policy"]
		if policy == "" {
			mu.Lock()
			unknown = append(unknown, addr+" (no maxmemory-policy in CONFIG GET reply)")
			mu.Unlock()
			return nil
		}
		if policy != "noeviction" {
			mu.Lock()
			evicting = append(evicting, fmt.Sprintf("%s has maxmemory-policy %s (maxmemory %s)", addr, policy, cfg["maxmemory"]))
			mu.Unlock()
		}
		return nil
	}

	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return check(ctx, n.Options().Addr, n)
		})
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return check(ctx, n.Options().Addr, n)
		})
	case *redis.Client:
		err = check(ctx, c.Options().Addr, c)
	default:
		err = check(ctx, "redis", c)
	}
	if err != nil {
		return fmt.Errorf("redisstore: checking the server: %w", err)
	}
	if len(unknown) > 0 {
		s.cfg.Logger.Info("redisstore: cannot read maxmemory-policy (CONFIG GET refused); make sure it is noeviction, or dedup records may be evicted", watermill.LogFields{
			"nodes": strings.Join(unknown, "; "),
		})
	}
	if len(evicting) > 0 {
		err := fmt.Errorf("%w: %s", ErrEvictionPolicy, strings.Join(evicting, "; "))
		s.cfg.Logger.Error("redisstore: Redis may evict live dedup records, so redeliveries of their messages would run again", err, watermill.LogFields{
			"prefix": s.cfg.Prefix,
		})
		return err
	}
	return nil
}
