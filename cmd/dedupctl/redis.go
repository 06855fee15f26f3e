package main

import (
	"context"
	"flag"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/storeopen"
)

// storeOfFlag is the store a connection flag belongs to ("" for the flags
// of every store, and the others).
func storeOfFlag(name string) string {
	switch {
	case strings.HasPrefix(name, "redis-"), name == "compact-keys", name == "digest-keys-longer-than":
		return storeRedis
	case strings.HasPrefix(name, "nats-"):
		return storeNATS
	case name == "postgres-dsn":
		return storePostgres
	case name == "mysql-dsn":
		return storeMySQL
	case name == "sqlite-file", name == "dir":
		return storeSQLite
	}
	return ""
}

// impliedStore is the store that the command line's flags point at, when
// they point at one only: -redis-addr=redis://host:6379/0 alone means
// -store=redis. The environment implies nothing: a shell's REDIS_ADDR
// may well be there for other programs.
func impliedStore(given []string) string {
	var found []string
	for _, name := range given {
		if s := storeOfFlag(name); s != "" && !slices.Contains(found, s) {
			found = append(found, s)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return ""
}

// trackSets makes every flag of fs record its name in given when it is
// set (the command line's, once the environment's are in).
func trackSets(fs *flag.FlagSet, given *[]string) {
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &trackedValue{Value: f.Value, set: func() { *given = append(*given, f.Name) }}
	})
}

// trackedValue is a flag.Value that reports each Set.
type trackedValue struct {
	flag.Value
	set func()
}

func (v *trackedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	v.set()
	return nil
}

// IsBoolFlag keeps -flag (without =true) working for a bool flag.
func (v *trackedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// isClusterNode tells whether the server behind client is a node of a
// Redis Cluster: CLUSTER SLOTS answers there, and fails on a server
// without cluster support. CLUSTER SLOTS, unlike INFO, is not
// @dangerous: the store's least-privilege ACL user may send it. A server
// that refuses it (another ACL) is taken for a single one.
func isClusterNode(ctx context.Context, client redis.UniversalClient) bool {
	ctx, cancel := context.WithTimeout(ctx, storeopen.DialTimeout)
	defer cancel()
	return client.ClusterSlots(ctx).Err() == nil
}
