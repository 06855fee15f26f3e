package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/neterr"
)

// ErrEvictionPolicy is returned by [Store.CheckServer] when a Redis node
// may evict dedup records to free memory. Every record has a TTL, so every
// policy but noeviction (volatile-* as much as allkeys-*) can drop a live
// record, and a redelivery of that message then runs its handler again.
var ErrEvictionPolicy = errors.New("redisstore: Redis maxmemory-policy may evict dedup records; set it to noeviction")

// ErrDataLimit is returned by [Store.CheckServer] when a Redis node
// refuses arguments as long as Config.MaxData needs: its
// proto-max-bulk-len is not above MaxData. Such a node would refuse a
// Complete of that much data, and close the connection; the store then
// refuses, before any I/O, data above what the node takes.
var ErrDataLimit = errors.New("redisstore: Redis proto-max-bulk-len is below Config.MaxData")

// CheckServer reads maxmemory-policy, maxmemory and proto-max-bulk-len
// from every node the client talks to (every master and replica in Redis
// Cluster, since a replica can be promoted) and reports a node whose
// policy is not noeviction, or that refuses data of Config.MaxData bytes:
// it logs an error through Config.Logger and returns an error wrapping
// [ErrEvictionPolicy] or [ErrDataLimit] (both, when both).
//
// A node where CONFIG GET is refused (renamed or disabled, as on many
// managed services, or denied by an ACL) cannot be checked: CheckServer
// logs that at Info level and does not count it as a failure. Other errors
// (the server is unreachable) are returned as they are.
//
// With Config.WaitReplicas it also reports a user the server denies WAIT
// or PEXPIRE ([ErrWaitDenied]: every write would fail) and a master with
// fewer replicas online than WaitReplicas ([ErrTooFewReplicas]).
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
		limited  []string
		takes    int64 // the most data every limited node takes
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
		n, err := protoMaxBulkLen(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if n > 0 && n-1 < int64(s.cfg.MaxData) {
			mu.Lock()
			limited = append(limited, fmt.Sprintf("%s has proto-max-bulk-len %d", addr, n))
			if takes == 0 || n-1 < takes {
				takes = max(n-1, 1)
			}
			mu.Unlock()
		}
		return nil
	}

	if err := s.forEachNode(ctx, check); err != nil {
		return fmt.Errorf("redisstore: checking the server: %w", err)
	}
	if len(unknown) > 0 {
		s.cfg.Logger.Info("redisstore: cannot read maxmemory-policy (CONFIG GET refused); make sure it is noeviction, or dedup records may be evicted", watermill.LogFields{
			"nodes": strings.Join(unknown, "; "),
		})
	}
	var errs []error
	if len(evicting) > 0 {
		err := fmt.Errorf("%w: %s", ErrEvictionPolicy, strings.Join(evicting, "; "))
		s.cfg.Logger.Error("redisstore: Redis may evict live dedup records, so redeliveries of their messages would run again", err, watermill.LogFields{
			"prefix": s.cfg.Prefix,
		})
		errs = append(errs, err)
	}
	if len(limited) > 0 {
		s.serverMaxData.Store(takes)
		err := fmt.Errorf("%w (%d bytes): %s; Complete refuses data above %d bytes", ErrDataLimit, s.cfg.MaxData, strings.Join(limited, "; "), takes)
		s.cfg.Logger.Error("redisstore: Redis refuses data of Config.MaxData bytes; lower MaxData or raise proto-max-bulk-len", err, watermill.LogFields{
			"prefix": s.cfg.Prefix,
		})
		errs = append(errs, err)
	}
	if err := s.checkReplicas(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// forEachNode runs check on every node the client talks to (every master
// and replica in Redis Cluster), concurrently where the client does.
func (s *Store) forEachNode(ctx context.Context, check func(ctx context.Context, addr string, c redis.Cmdable) error) error {
	switch c := s.client.(type) {
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

// protoMaxBulkLen reads a node's proto-max-bulk-len: 0 when the node does
// not say (CONFIG GET refused or renamed).
func protoMaxBulkLen(ctx context.Context, c redis.Cmdable) (int64, error) {
	cfg, err := c.ConfigGet(ctx, "proto-max-bulk-len").Result()
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, _ := strconv.ParseInt(cfg["proto-max-bulk-len"], 10, 64)
	return n, nil
}

// leastBulkLen is the least proto-max-bulk-len a Redis can be configured
// with: a value of at most this many bytes, data and its tag byte, is
// never refused as too long.
const leastBulkLen = 1 << 20

// tooLargeAfter tells, for a Complete of data that failed with err (an
// outage, or a connection that broke), whether the server refused the
// data as too long: Redis answers an argument over its
// proto-max-bulk-len with an error and closes the connection, and a
// client still writing the argument then sees the connection reset, not
// the answer. So when the data could be
// over a node's limit, the store reads the limits, and refuses data over
// them from then on before any I/O.
func (s *Store) tooLargeAfter(ctx context.Context, data []byte, err error) error {
	if !(errors.Is(err, stores.ErrUnavailable) || neterr.ConnLost(err)) || len(data)+1 <= leastBulkLen || ctx.Err() != nil {
		return err
	}
	var (
		mu    sync.Mutex
		least int64
	)
	if s.forEachNode(ctx, func(ctx context.Context, _ string, c redis.Cmdable) error {
		n, err := protoMaxBulkLen(ctx, c)
		mu.Lock()
		if n > 0 && (least == 0 || n < least) {
			least = n
		}
		mu.Unlock()
		return err
	}) != nil || least == 0 || int64(len(data))+1 <= least {
		return err // an outage, or the limits do not explain it
	}
	if least-1 < int64(s.cfg.MaxData) {
		s.serverMaxData.Store(least - 1)
	}
	// The outage, if the store took it for one, is not wrapped: it is
	// not one.
	return fmt.Errorf("redisstore: complete: %w: %d bytes of data, the server takes at most %d (its proto-max-bulk-len is below Config.MaxData), and closed the connection on it (%v)", stores.ErrTooLarge, len(data), least-1, err)
}
