package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// record, and a redelivery of that message then runs its handler again:
// set maxmemory-policy to noeviction.
var ErrEvictionPolicy = errors.New("redisstore: Redis maxmemory-policy may evict dedup records")

// ErrDataLimit is returned by [Store.CheckServer] when a Redis node
// refuses arguments as long as Config.MaxData needs: its
// proto-max-bulk-len is not above MaxData. Such a node would refuse a
// Complete of that much data, and close the connection; the store then
// refuses, before any I/O, data above what the node takes.
var ErrDataLimit = errors.New("redisstore: Redis proto-max-bulk-len is below Config.MaxData")

// ErrWaitDenied is returned by [Store.CheckServer] when, with
// Config.WaitReplicas, the server denies the store's user WAIT or
// PEXPIRE (its ACL rule lacks +wait +pexpire): every write would fail.
var ErrWaitDenied = errors.New("redisstore: the Redis user may not run a command Config.WaitReplicas needs")

// ErrTooFewReplicas is returned by [Store.CheckServer] when a master
// has fewer replicas online than Config.WaitReplicas: every write to it
// fails with [ErrNotReplicated] until enough are back.
var ErrTooFewReplicas = errors.New("redisstore: a Redis master has fewer replicas online than Config.WaitReplicas")

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

	if err := forEachNode(ctx, s.client, check); err != nil {
		return fmt.Errorf("redisstore: checking the server: %w", err)
	}
	if len(unknown) > 0 {
		s.cfg.Logger.Info("redisstore: CONFIG GET refused: cannot check that maxmemory-policy is noeviction", watermill.LogFields{
			"nodes":  strings.Join(unknown, "; "),
			"advice": "make sure maxmemory-policy is noeviction, or dedup records may be evicted",
		})
	}
	var errs []error
	if len(evicting) > 0 {
		err := fmt.Errorf("%w: %s", ErrEvictionPolicy, strings.Join(evicting, "; "))
		s.cfg.Logger.Error("redisstore: Redis may evict live dedup records", err, watermill.LogFields{
			"prefix": s.cfg.Prefix,
			"advice": "set maxmemory-policy to noeviction: a redelivery of a message whose record was evicted runs again",
		})
		errs = append(errs, err)
	}
	if len(limited) > 0 {
		s.serverMaxData.Store(takes)
		err := fmt.Errorf("%w (%d bytes): %s; Complete refuses data above %d bytes", ErrDataLimit, s.cfg.MaxData, strings.Join(limited, "; "), takes)
		s.cfg.Logger.Error("redisstore: Redis refuses data of Config.MaxData bytes", err, watermill.LogFields{
			"prefix": s.cfg.Prefix,
			"advice": "lower Config.MaxData or raise proto-max-bulk-len",
		})
		errs = append(errs, err)
	}
	if err := s.checkReplicas(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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

// checkReplicas reports, with WaitReplicas, every master with fewer
// replicas online than that (INFO replication); replicas (a Cluster's)
// are passed over. A node whose INFO is refused is not counted as a
// failure, as for CONFIG GET.
func (s *Store) checkReplicas(ctx context.Context) error {
	if !s.waiting() {
		return nil
	}
	if err := s.checkWaitACL(ctx); err != nil {
		return err
	}
	var (
		mu  sync.Mutex
		few []string
	)
	err := forEachNode(ctx, s.client, func(ctx context.Context, addr string, c redis.Cmdable) error {
		info, err := c.Info(ctx, "replication").Result()
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if !strings.Contains(info, "role:master") {
			return nil
		}
		if n := strings.Count(info, "state=online"); n < s.cfg.WaitReplicas {
			mu.Lock()
			few = append(few, fmt.Sprintf("%s has %d", addr, n))
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstore: checking the replicas: %w", err)
	}
	if len(few) == 0 {
		return nil
	}
	err = fmt.Errorf("%w (%d): %s", ErrTooFewReplicas, s.cfg.WaitReplicas, strings.Join(few, "; "))
	s.cfg.Logger.Error("redisstore: a Redis master has too few replicas for Config.WaitReplicas", err, watermill.LogFields{
		"advice": "its writes fail as not replicated until enough replicas are online",
	})
	return err
}

// checkWaitACL reports a user the server denies a command WaitReplicas
// needs: WAIT (on any node: ACLs are each node's), and PEXPIRE, which
// the fenced scripts send to confirm a refusal. WAIT 0 0 answers at once;
// PEXPIRE GT on the bare prefix, which is no record's key, changes no
// expiry (GT never shortens one, nor sets one on a key without). Only a
// NOPERM counts: another refusal (a Redis before 7.0 takes no GT) says
// the user may run the command.
func (s *Store) checkWaitACL(ctx context.Context) error {
	var (
		mu     sync.Mutex
		denied []string
		nodes  []string
	)
	deny := func(cmd, addr string) {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(denied, cmd) {
			denied = append(denied, cmd)
		}
		if !slices.Contains(nodes, addr) {
			nodes = append(nodes, addr)
		}
	}
	err := forEachNode(ctx, s.client, func(ctx context.Context, addr string, c redis.Cmdable) error {
		// Do, not Wait: go-redis lifts the read timeout off a Wait.
		d, ok := c.(interface {
			Do(ctx context.Context, args ...any) *redis.Cmd
		})
		if !ok {
			return nil // New refuses such a client with WaitReplicas
		}
		if err := d.Do(ctx, "wait", 0, 0).Err(); isNoPerm(err) {
			deny("WAIT", addr)
		} else if err != nil && !isRedisError(err) {
			return fmt.Errorf("%s: %w", addr, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstore: checking the user's permissions: %w", err)
	}
	if err := s.client.Do(ctx, "pexpire", s.cfg.Prefix, 1, "gt").Err(); isNoPerm(err) {
		deny("PEXPIRE", "the prefix's node")
	} else if err != nil && !isRedisError(err) {
		return fmt.Errorf("redisstore: checking the user's permissions: %w", err)
	}
	if len(denied) == 0 {
		return nil
	}
	err = fmt.Errorf("%w (denied %s): the user's ACL rule lacks +wait +pexpire", ErrWaitDenied, strings.Join(denied, ", "))
	s.cfg.Logger.Error("redisstore: the Redis user may not run WAIT or PEXPIRE", err, watermill.LogFields{
		"prefix": s.cfg.Prefix,
		"advice": "add +wait +pexpire to the user's ACL rule (see the README): Config.WaitReplicas needs them, and every write fails until then",
	})
	return err
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
	if forEachNode(ctx, s.client, func(ctx context.Context, _ string, c redis.Cmdable) error {
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
	return fmt.Errorf("redisstore: complete: %w: %d bytes of data, above the %d bytes the server's proto-max-bulk-len takes (%v)", stores.ErrTooLarge, len(data), least-1, err)
}
