package storeopen

import (
	"context"
	"flag"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// redisKind is redisstore on one Redis, or on a Redis Cluster
// (-redis-cluster).
var redisKind = &Kind{
	Name:    "redis",
	Service: "Redis",
	flags: func(fs *flag.FlagSet, s *Settings) {
		r := &s.Redis
		fs.StringVar(&r.Addr, "redis-addr", firstOf(r.Addr, DefaultRedisAddr), "Redis `address`: host:port, or a URL redis://user:password@host:port/db "+
			"(rediss:// for TLS; a password is safer in REDIS_ADDR than on the command line); "+
			"with -redis-cluster, comma-separated addresses or URLs of some of its nodes")
		fs.BoolVar(&r.Cluster, "redis-cluster", r.Cluster, "Redis is a Redis Cluster")
		r.TLS.RegisterFlags(fs)
		fs.StringVar(&r.Prefix, "redis-prefix", r.Prefix,
			"the store's key prefix, Config.Prefix (default \"dedup:\", \"d:\" with -compact-keys, \"router_example:<run id>:\" with -run-id)")
		fs.BoolVar(&r.CompactKeys, "compact-keys", r.CompactKeys, "the store runs with Config.CompactKeys")
		fs.IntVar(&r.DigestKeysLongerThan, "digest-keys-longer-than", r.DigestKeysLongerThan, "the store's Config.DigestKeysLongerThan")
	},
	runName: func(runID string) string { return "router_example:" + runID + ":" },
	open:    openRedisStore,
}

// RedisSettings are where Redis is (-redis-addr, -redis-cluster and the
// TLS files) and, with Request.Admin, how the store lays out its keys.
type RedisSettings struct {
	RedisConfig

	// Prefix is the store's key prefix (-redis-prefix); empty: the run's
	// of -run-id, else the store's default.
	Prefix string

	// CompactKeys and DigestKeysLongerThan are the store's (-compact-keys,
	// -digest-keys-longer-than), with Request.Admin.
	CompactKeys          bool
	DigestKeysLongerThan int
}

func openRedisStore(ctx context.Context, o Opener, r Request, out *Opened) error {
	s := r.Settings
	cfg, err := configOf[redisstore.Config](out.Kind, r)
	if err != nil {
		return err
	}
	name := r.name(out.Kind, s.Redis.Prefix)
	if name != "" {
		cfg.Prefix = name
	}
	if cfg.Logger == nil {
		cfg.Logger = r.Logger
	}
	if r.Admin {
		cfg.CompactKeys, cfg.DigestKeysLongerThan = s.Redis.CompactKeys, s.Redis.DigestKeysLongerThan
		// An administrator's commands, one at a time: no check of the
		// server's settings (an ACL user may not read them), no batching.
		cfg.SkipServerCheck = true
		cfg.Batch = redisstore.BatchConfig{Disabled: true}
	}
	client, t, err := o.OpenRedis(ctx, s.Redis.RedisConfig)
	if err != nil {
		return err
	}
	out.Redis, out.Addr = client, t.Display
	out.onClose(func(context.Context) error { return client.Close() })
	if t.Cluster {
		out.Service = "Redis Cluster"
	} else if r.Admin && isClusterNode(ctx, client) {
		// A node of a Cluster holds a part of the records only.
		return &SettingError{Err: fmt.Errorf("the Redis at %s is a node of a Redis Cluster: add -redis-cluster", t.Display)}
	}
	st, err := redisstore.New(client, cfg)
	if err != nil {
		if r.Admin {
			return &SettingError{Err: err}
		}
		return err
	}
	out.setStore(st)
	out.Name = cfg.Prefix
	if out.Name == "" {
		out.Name = redisstore.DefaultPrefix
		if cfg.CompactKeys {
			out.Name = redisstore.DefaultCompactPrefix
		}
	}
	out.Records = fmt.Sprintf("prefix %q", out.Name)
	if name != "" {
		out.remove = func(ctx context.Context) error { return redisclean.DeletePrefix(ctx, client, name) }
		out.Removal = "delete Redis keys " + name + "*"
	}
	return nil
}

// isClusterNode tells whether the server behind client is a node of a
// Redis Cluster: CLUSTER SLOTS answers there, and fails on a server
// without cluster support. CLUSTER SLOTS, unlike INFO, is not
// @dangerous: the store's least-privilege ACL user may send it. A server
// that refuses it (another ACL) is taken for a single one.
func isClusterNode(ctx context.Context, client redis.UniversalClient) bool {
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	return client.ClusterSlots(ctx).Err() == nil
}

// firstOf returns the first of names that is not empty.
func firstOf(names ...string) string {
	for _, n := range names {
		if n != "" {
			return n
		}
	}
	return ""
}
