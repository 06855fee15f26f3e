package anystore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/watermill-dedup/dedup/internal/sqlpool"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// StoreKind names a dedup store and the service behind it.
type StoreKind string

// The stores OpenStore opens.
const (
	StoreMemory       StoreKind = "memory"        // memstore, in the process
	StoreRedis        StoreKind = "redis"         // redisstore on one Redis
	StoreRedisCluster StoreKind = "redis-cluster" // redisstore on a Redis Cluster
	StorePostgres     StoreKind = "postgres"      // sqlstore on PostgreSQL
	StoreMySQL        StoreKind = "mysql"         // sqlstore on MySQL/MariaDB
	StoreSQLite       StoreKind = "sqlite"        // sqlstore on a SQLite file
	StoreNATS         StoreKind = "nats"          // natsstore on NATS JetStream
)

// StoreKinds lists every StoreKind: storeopen's kinds, and redis-cluster
// after redis.
func StoreKinds() []StoreKind {
	var out []StoreKind
	for _, name := range storeopen.Names(nil) {
		out = append(out, StoreKind(name))
		if StoreKind(name) == StoreRedis {
			out = append(out, StoreRedisCluster)
		}
	}
	return out
}

// SQLDialect returns the sqlstore dialect of a SQL kind, and false for the
// others.
func (k StoreKind) SQLDialect() (sqlstore.Dialect, bool) {
	if sk, ok := storeopen.Lookup(string(k)); ok && sk.Dialect != "" {
		return sk.Dialect, true
	}
	return "", false
}

// StoreParams says which store OpenStore opens and where. The zero value
// of every field but Kind means a default.
type StoreParams struct {
	// Kind is the store. Required.
	Kind StoreKind

	// DSN is the database to connect to (postgres, mysql). The default is
	// PostgresDSN() or MySQLDSN(): the local test database or the
	// environment's.
	DSN string

	// Addr replaces the host:port of the service (redis, postgres, mysql,
	// nats): a test's Proxy, say. The default is the DSN's, RedisAddr()
	// or NATSAddr(). For
	// redis-cluster it is the comma-separated addresses of some of its nodes, required.
	Addr string

	// Path is the SQLite file. The default is a file in a new temporary
	// directory that the cleanup removes.
	Path string

	// Name is the table (SQL), the key prefix (Redis) or the KV bucket
	// (NATS) the store keeps its records under: unique to the test or
	// run, since tests share the services. The default is a new random
	// one ("dedup_<hex>", "dedup:<hex>:").
	Name string

	// CreateSchema creates the SQL table (if it does not exist). Create it
	// once per Name: several processes creating it at once may collide.
	CreateSchema bool

	// Teardown makes the cleanup also delete what the store kept under
	// Name: drop the table, delete the Redis keys under the prefix, delete
	// the NATS buckets (and only those: never FLUSHDB or TRUNCATE a shared
	// service).
	Teardown bool

	// PoolSize bounds the connections: the SQL pool (default 8; SQLite 1,
	// so handlers queue in database/sql instead of spinning on SQLite's
	// write lock), the Redis pool (default go-redis's).
	PoolSize int

	// DialTimeout bounds each connection attempt. The default is 2
	// seconds. The first ping, which proves the service is up, may take
	// up to 15 seconds: a loaded CI machine can be that slow to answer.
	DialTimeout time.Duration

	// RedisOptions, if set, adjusts the Redis client's options (redis
	// kind) before the client is made: retries, timeouts.
	RedisOptions func(*redis.Options)

	// The stores' own configurations. OpenStore sets the name (Table,
	// Prefix, Bucket) and the Dialect; everything else is passed on.
	Memory memstore.Config
	Redis  redisstore.Config
	SQL    sqlstore.Config
	NATS   natsstore.Config

	// Config is the own configuration of a store kind without a field of
	// its own above, of its package's type (see storeopen.Request.Config).
	Config any
}

// OpenedStore is a store OpenStore opened, with what is behind it.
type OpenedStore struct {
	Store stores.Store
	Kind  StoreKind

	// Addr says where the store is, without a password: host:port
	// (host:port/database for SQL), the SQLite file, "in-process".
	Addr string

	// Name is the table or key prefix (empty for memory).
	Name string

	// DB is the database of a SQL store, Dialect its flavour.
	DB      *sql.DB
	Dialect sqlstore.Dialect

	// Redis is the client of a Redis store.
	Redis redis.UniversalClient

	// NATS is the connection of a NATS store.
	NATS *nats.Conn

	// Path is the SQLite file.
	Path string
}

// Default sizes of OpenStore's pools and dials.
const (
	DefaultPoolSize    = 8
	DefaultDialTimeout = 2 * time.Second
	// minPingTimeout bounds the first ping from below: a loaded CI
	// machine can take seconds to answer a service that is up, and a
	// store that fails to open fails its whole test.
	minPingTimeout = 15 * time.Second
)

// UnreachableError is OpenStore's error when the service does not answer
// or refuses: the programs' (see storeopen.UnreachableError).
type UnreachableError = storeopen.UnreachableError

// OpenStore opens the store p describes and returns it with its cleanup,
// which closes the store and every client OpenStore made (and, with
// Teardown, deletes the records first) and reports what failed. When it
// returns an error, nothing stays open. An unreachable service is an
// *UnreachableError.
//
// It never closes a client it did not make: there is none to hand in. A
// test that needs its own client builds the store itself.
//
// It opens every kind as the programs do, through storeopen's registry
// (storeopen.Opener.Open), with the tests' pools, time-outs and setting
// names.
func OpenStore(ctx context.Context, p StoreParams) (*OpenedStore, func(context.Context) error, error) {
	if p.DialTimeout <= 0 {
		p.DialTimeout = DefaultDialTimeout
	}
	kind, cluster := string(p.Kind), p.Kind == StoreRedisCluster
	switch {
	case p.Kind == "":
		return nil, nil, errors.New("testkit: StoreParams.Kind is required")
	case cluster:
		kind = string(StoreRedis)
		if p.Addr == "" {
			return nil, nil, errors.New("testkit: a redis-cluster store needs StoreParams.Addr, the addresses of its nodes")
		}
	}
	k, ok := storeopen.Lookup(kind)
	if !ok {
		return nil, nil, fmt.Errorf("testkit: unknown store kind %q (want one of %v)", p.Kind, StoreKinds())
	}
	settings, err := p.settings()
	if err != nil {
		return nil, nil, err
	}
	name := p.Name
	if name == "" {
		name = testkit.UniqueName("dedup_")
		if k.Name == string(StoreRedis) {
			name = testkit.UniqueName("dedup:") + ":"
		}
	}
	o, err := p.opener().Open(ctx, kind, storeopen.Request{
		Settings:      settings,
		Name:          name,
		Config:        p.config(),
		CreateSchema:  p.CreateSchema,
		RemoveOnClose: p.Teardown,
	})
	if err != nil {
		return nil, nil, err
	}
	return &OpenedStore{
		Store: o.Store, Kind: p.Kind, Addr: o.Addr, Name: o.Name,
		DB: o.DB, Dialect: k.Dialect, Redis: o.Redis, NATS: o.NATS, Path: o.Path,
	}, o.Close, nil
}

// opener is how OpenStore opens p's services: bounded pools (the servers
// are shared, and a router runs every message in flight in its own
// goroutine), the first ping up to minPingTimeout, and errors that name
// the test's settings.
func (p StoreParams) opener() storeopen.Opener {
	redisSetting := "REDIS_ADDR"
	if p.Kind == StoreRedisCluster {
		redisSetting = "StoreParams.Addr"
	}
	return storeopen.Opener{
		MaxConns:    cmp.Or(max(p.PoolSize, 0), DefaultPoolSize),
		SQLiteConns: p.PoolSize,
		TempDir:     "testkit-sqlite-",
		DialTimeout: p.DialTimeout,
		PingTimeout: pingTimeout(p.DialTimeout),
		RedisOptions: func(o *redis.Options) {
			o.PoolTimeout, o.PoolSize = 2*p.DialTimeout, p.PoolSize
			// go-redis's retries, not the programs' single one.
			o.MaxRetries, o.DialerRetries = 0, 0
			if p.RedisOptions != nil {
				p.RedisOptions(o)
			}
		},
		RedisClusterOptions: func(o *redis.ClusterOptions) {
			o.PoolTimeout, o.PoolSize, o.MaxRetries = 2*p.DialTimeout, p.PoolSize, 0
		},
		NATSOptions: []nats.Option{
			nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
			// A write made as the connection drops is refused, not sent at
			// the reconnect (natsstore's README).
			nats.ReconnectBufSize(-1),
			// The store reports what the connection goes through.
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
		},
		SettingNames: map[string]string{
			storeopen.RedisSetting:    redisSetting,
			storeopen.PostgresSetting: "POSTGRES_DSN",
			storeopen.MySQLSetting:    "MYSQL_DSN",
			storeopen.SQLiteSetting:   "StoreParams.Path",
			storeopen.NATSSetting:     "NATS_URL",
		},
	}
}

// settings are where p's service is: Addr, DSN and Path, else the local
// test services or the environment's.
func (p StoreParams) settings() (storeopen.Settings, error) {
	var s storeopen.Settings
	switch p.Kind {
	case StoreRedis, StoreRedisCluster:
		s.Redis.Addr, s.Redis.Cluster = or(p.Addr, testkit.RedisAddr()), p.Kind == StoreRedisCluster
	case StorePostgres:
		u, err := url.Parse(or(p.DSN, testkit.PostgresDSN()))
		if err != nil {
			return s, fmt.Errorf("testkit: PostgreSQL DSN: %w", err)
		}
		if p.Addr != "" {
			u.Host = p.Addr
		}
		q := u.Query()
		if q.Get("connect_timeout") == "" {
			q.Set("connect_timeout", strconv.Itoa(max(1, int(p.DialTimeout.Seconds()))))
		}
		u.RawQuery = q.Encode()
		s.PostgresDSN = u.String()
	case StoreMySQL:
		mc, err := mysql.ParseDSN(or(p.DSN, testkit.MySQLDSN()))
		if err != nil {
			return s, fmt.Errorf("testkit: MySQL DSN: %w", err)
		}
		if p.Addr != "" {
			mc.Addr = p.Addr
		}
		if mc.Timeout == 0 {
			mc.Timeout = p.DialTimeout
		}
		s.MySQLDSN = mc.FormatDSN()
	case StoreSQLite:
		s.SQLite.File = p.Path
	case StoreNATS:
		s.NATS.URL = "nats://" + or(p.Addr, testkit.NATSAddr())
	}
	return s, nil
}

// config is the store's own configuration p gives.
func (p StoreParams) config() any {
	switch p.Kind {
	case StoreMemory:
		return p.Memory
	case StoreRedis, StoreRedisCluster:
		return p.Redis
	case StorePostgres, StoreMySQL, StoreSQLite:
		return p.SQL
	case StoreNATS:
		return p.NATS
	}
	return p.Config
}

// RequireStore checks that the service behind kind answers (see
// Unavailable) and returns its host:port: the target of a Proxy, the
// StoreParams.Addr that goes through it. Memory and SQLite have no
// service: it returns "". A redis-cluster has no default service here;
// it fails the test.
func RequireStore(t testing.TB, kind StoreKind) string {
	t.Helper()
	switch kind {
	case StoreRedis:
		return testkit.RequireRedis(t)
	case StorePostgres:
		return testkit.HostPort(testkit.RequirePostgres(t), "127.0.0.1:5432")
	case StoreMySQL:
		return testkit.MySQLAddr(testkit.RequireMySQL(t))
	case StoreNATS:
		testkit.RequireNATS(t)
		return testkit.NATSAddr()
	case StoreMemory, StoreSQLite:
		return ""
	}
	t.Fatalf("testkit: RequireStore: no default service for store kind %q", kind)
	return ""
}

// OpenDB opens and pings the database of a SQL kind the way OpenStore
// does (DSN, Addr, Path, PoolSize and DialTimeout of p), without a store:
// for a pub/sub on the store's database, say. The caller closes it. SQLite
// needs p.Path. An unreachable server is an *UnreachableError.
func OpenDB(ctx context.Context, p StoreParams) (*sql.DB, error) {
	d, ok := p.Kind.SQLDialect()
	if !ok {
		return nil, fmt.Errorf("testkit: OpenDB: %q is not a SQL store kind", p.Kind)
	}
	if p.Kind == StoreSQLite && p.Path == "" {
		return nil, errors.New("testkit: OpenDB: SQLite needs StoreParams.Path")
	}
	if p.DialTimeout <= 0 {
		p.DialTimeout = DefaultDialTimeout
	}
	s, err := p.settings()
	if err != nil {
		return nil, err
	}
	o := p.opener()
	switch p.Kind {
	case StoreSQLite:
		db, err := sqlpool.Open(ctx, "sqlite", sqlstore.SQLiteDSN(p.Path), cmp.Or(max(p.PoolSize, 0), 1), o.PingTimeout)
		if err != nil {
			return nil, &UnreachableError{Service: "SQLite", Addr: p.Path, Setting: "StoreParams.Path", Err: err}
		}
		return db, nil
	case StorePostgres:
		db, _, err := o.DB(ctx, d, s.PostgresDSN)
		return db, err
	default:
		db, _, err := o.DB(ctx, d, s.MySQLDSN)
		return db, err
	}
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// pingTimeout is how long the first ping of an opened client may take.
func pingTimeout(dial time.Duration) time.Duration { return max(dial, minPingTimeout) }
