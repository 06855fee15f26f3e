package testkit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/watermill-dedup/dedup/internal/storeopen"
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

// StoreKinds lists every StoreKind.
func StoreKinds() []StoreKind {
	return []StoreKind{StoreMemory, StoreRedis, StoreRedisCluster, StorePostgres, StoreMySQL, StoreSQLite, StoreNATS}
}

// SQLDialect returns the sqlstore dialect of a SQL kind, and false for the
// others.
func (k StoreKind) SQLDialect() (sqlstore.Dialect, bool) {
	switch k {
	case StorePostgres:
		return sqlstore.Postgres, true
	case StoreMySQL:
		return sqlstore.MySQL, true
	case StoreSQLite:
		return sqlstore.SQLite, true
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
	// Prefix) and the Dialect; everything else is passed on.
	Memory memstore.Config
	Redis  redisstore.Config
	SQL    sqlstore.Config
	NATS   natsstore.Config
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

// UniqueName returns prefix followed by 10 random hex digits: a table or
// key name no other test or run uses.
func UniqueName(prefix string) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// OpenStore opens the store p describes and returns it with its cleanup,
// which closes the store and every client OpenStore made (and, with
// Teardown, deletes the records first) and reports what failed. When it
// returns an error, nothing stays open. An unreachable service is an
// *UnreachableError.
//
// It never closes a client it did not make: there is none to hand in. A
// test that needs its own client builds the store itself.
func OpenStore(ctx context.Context, p StoreParams) (*OpenedStore, func(context.Context) error, error) {
	if p.DialTimeout <= 0 {
		p.DialTimeout = DefaultDialTimeout
	}
	var cl closers
	o, err := p.open(ctx, &cl)
	if err != nil {
		_ = cl.run(context.Background())
		return nil, nil, err
	}
	return o, cl.run, nil
}

func (p StoreParams) open(ctx context.Context, cl *closers) (*OpenedStore, error) {
	switch p.Kind {
	case StoreMemory:
		s, err := memstore.New(p.Memory)
		if err != nil {
			return nil, err
		}
		cl.add(s.Close)
		return &OpenedStore{Store: s, Kind: p.Kind, Addr: "in-process"}, nil
	case StoreRedis, StoreRedisCluster:
		return p.openRedis(ctx, cl)
	case StorePostgres, StoreMySQL, StoreSQLite:
		return p.openSQL(ctx, cl)
	case StoreNATS:
		return p.openNATS(ctx, cl)
	case "":
		return nil, errors.New("testkit: StoreParams.Kind is required")
	}
	return nil, fmt.Errorf("testkit: unknown store kind %q (want one of %v)", p.Kind, StoreKinds())
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
		return RequireRedis(t)
	case StorePostgres:
		return hostPort(RequirePostgres(t), "127.0.0.1:5432")
	case StoreMySQL:
		return mysqlAddr(RequireMySQL(t))
	case StoreNATS:
		RequireNATS(t)
		return NATSAddr()
	case StoreMemory, StoreSQLite:
		return ""
	}
	t.Fatalf("testkit: RequireStore: no default service for store kind %q", kind)
	return ""
}

func (p StoreParams) openRedis(ctx context.Context, cl *closers) (*OpenedStore, error) {
	var (
		client  redis.UniversalClient
		addr    = p.Addr
		service = "Redis"
		setting = "REDIS_ADDR"
	)
	if p.Kind == StoreRedisCluster {
		service, setting = "Redis Cluster", "StoreParams.Addr"
		if addr == "" {
			return nil, errors.New("testkit: a redis-cluster store needs StoreParams.Addr, the addresses of its nodes")
		}
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 strings.Split(addr, ","),
			ContextTimeoutEnabled: true,
			DialTimeout:           p.DialTimeout,
			PoolTimeout:           2 * p.DialTimeout,
			PoolSize:              p.PoolSize,
		})
	} else {
		if addr == "" {
			addr = RedisAddr()
		}
		opts := &redis.Options{
			Addr: addr,
			// The caller's context (the middleware's StoreTimeout) then
			// bounds every call.
			ContextTimeoutEnabled: true,
			DialTimeout:           p.DialTimeout,
			PoolTimeout:           2 * p.DialTimeout,
			PoolSize:              p.PoolSize,
		}
		if p.RedisOptions != nil {
			p.RedisOptions(opts)
		}
		client = redis.NewClient(opts)
	}
	cl.add(func(context.Context) error { return client.Close() })
	pctx, cancel := context.WithTimeout(ctx, pingTimeout(p.DialTimeout))
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		return nil, &UnreachableError{Service: service, Addr: addr, Setting: setting, Err: err}
	}
	name := p.Name
	if name == "" {
		name = UniqueName("dedup:") + ":"
	}
	cfg := p.Redis
	cfg.Prefix = name
	s, err := redisstore.New(client, cfg)
	if err != nil {
		return nil, err
	}
	if p.Teardown {
		cl.add(func(ctx context.Context) error { return DeleteRedisPrefix(ctx, client, name) })
	}
	cl.add(s.Close)
	return &OpenedStore{Store: s, Kind: p.Kind, Addr: addr, Name: name, Redis: client}, nil
}

// DeleteRedisPrefix deletes the keys under prefix, and only those (SCAN
// and DEL, never FLUSHDB a shared Redis); on a cluster, on every master.
// It is the programs' storeopen.DeleteRedisPrefix.
func DeleteRedisPrefix(ctx context.Context, client redis.UniversalClient, prefix string) error {
	return storeopen.DeleteRedisPrefix(ctx, client, prefix)
}

func (p StoreParams) openNATS(ctx context.Context, cl *closers) (*OpenedStore, error) {
	addr := or(p.Addr, NATSAddr())
	nc, err := nats.Connect("nats://"+addr,
		nats.Timeout(p.DialTimeout),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		// A write made as the connection drops is refused, not sent at
		// the reconnect (natsstore's README).
		nats.ReconnectBufSize(-1),
		// The store reports what the connection goes through.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, &UnreachableError{Service: "NATS", Addr: addr, Setting: "NATS_URL", Err: err}
	}
	cl.add(func(context.Context) error { nc.Close(); return nil })
	cfg := p.NATS
	cfg.Bucket = or(p.Name, UniqueName("dedup_"))
	if p.Teardown {
		// Registered before the store's Close, so it runs after it.
		cl.add(func(ctx context.Context) error { return DeleteNATSBuckets(ctx, nc, cfg) })
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout(p.DialTimeout))
	defer cancel()
	s, err := natsstore.New(pctx, nc, cfg)
	if err != nil {
		if errors.Is(err, stores.ErrUnavailable) {
			return nil, &UnreachableError{Service: "NATS JetStream", Addr: addr, Setting: "NATS_URL", Err: err}
		}
		return nil, err
	}
	cl.add(s.Close)
	return &OpenedStore{Store: s, Kind: p.Kind, Addr: addr, Name: cfg.Bucket, NATS: nc}, nil
}

// DeleteNATSBuckets deletes the KV buckets of cfg (every shard's), and
// only those.
func DeleteNATSBuckets(ctx context.Context, nc *nats.Conn, cfg natsstore.Config) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var errs []error
	for _, b := range cfg.Buckets() {
		if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			errs = append(errs, fmt.Errorf("testkit: delete bucket %s: %w", b, err))
		}
	}
	return errors.Join(errs...)
}

func (p StoreParams) openSQL(ctx context.Context, cl *closers) (*OpenedStore, error) {
	d, _ := p.Kind.SQLDialect()
	if p.Kind == StoreSQLite && p.Path == "" {
		dir, err := os.MkdirTemp("", "testkit-sqlite-")
		if err != nil {
			return nil, err
		}
		cl.add(func(context.Context) error { return os.RemoveAll(dir) })
		p.Path = filepath.Join(dir, "dedup.db")
	}
	db, addr, err := p.openDB(ctx)
	if err != nil {
		return nil, err
	}
	cl.add(func(context.Context) error { return db.Close() })
	name := p.Name
	if name == "" {
		name = UniqueName("dedup_")
	}
	cfg := p.SQL
	cfg.Dialect, cfg.Table = d, name
	s, err := sqlstore.New(db, cfg)
	if err != nil {
		return nil, err
	}
	if p.Teardown {
		// Registered before the store's Close, so it runs after it: the
		// purge job (if any) has stopped.
		cl.add(func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
			return err
		})
	}
	cl.add(s.Close)
	if p.CreateSchema {
		if err := s.CreateSchema(ctx); err != nil {
			return nil, fmt.Errorf("testkit: create the table %s on %s: %w", name, addr, err)
		}
	}
	return &OpenedStore{Store: s, Kind: p.Kind, Addr: addr, Name: name, DB: db, Dialect: d, Path: p.Path}, nil
}

// OpenDB opens and pings the database of a SQL kind the way OpenStore
// does (DSN, Addr, Path, PoolSize and DialTimeout of p), without a store:
// for a pub/sub on the store's database, say. The caller closes it. SQLite
// needs p.Path. An unreachable server is an *UnreachableError.
func OpenDB(ctx context.Context, p StoreParams) (*sql.DB, error) {
	if _, ok := p.Kind.SQLDialect(); !ok {
		return nil, fmt.Errorf("testkit: OpenDB: %q is not a SQL store kind", p.Kind)
	}
	if p.Kind == StoreSQLite && p.Path == "" {
		return nil, errors.New("testkit: OpenDB: SQLite needs StoreParams.Path")
	}
	if p.DialTimeout <= 0 {
		p.DialTimeout = DefaultDialTimeout
	}
	db, _, err := p.openDB(ctx)
	return db, err
}

// DropTables drops the tables of a SQL kind's database db, and only
// those (never TRUNCATE or drop a shared database). A name is quoted for
// the kind unless it is already: watermill-sql's adapters return their
// table names quoted. It tries every table and returns what failed. In a
// Cleanup, pass a context of its own: the test's has ended by then.
func DropTables(ctx context.Context, db *sql.DB, kind StoreKind, tables ...string) error {
	if _, ok := kind.SQLDialect(); !ok {
		return fmt.Errorf("testkit: DropTables: %q is not a SQL store kind", kind)
	}
	quote := `"`
	if kind == StoreMySQL {
		quote = "`"
	}
	var errs []error
	for _, table := range tables {
		name := table
		if !strings.HasPrefix(name, `"`) && !strings.HasPrefix(name, "`") {
			name = quote + name + quote
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", table, err))
		}
	}
	return errors.Join(errs...)
}

// openDB opens and pings the database of a SQL kind.
func (p StoreParams) openDB(ctx context.Context) (*sql.DB, string, error) {
	var (
		driver, dsn, addr, service, setting string
		conns                               = p.PoolSize
	)
	switch p.Kind {
	case StoreSQLite:
		driver, dsn, addr, service, setting = "sqlite", sqlstore.SQLiteDSN(p.Path), p.Path, "SQLite", "StoreParams.Path"
		if conns <= 0 {
			conns = 1
		}
	case StorePostgres:
		service, setting = "PostgreSQL", "POSTGRES_DSN"
		u, err := url.Parse(or(p.DSN, PostgresDSN()))
		if err != nil {
			return nil, "", fmt.Errorf("testkit: PostgreSQL DSN: %w", err)
		}
		if p.Addr != "" {
			u.Host = p.Addr
		}
		q := u.Query()
		if q.Get("connect_timeout") == "" {
			q.Set("connect_timeout", strconv.Itoa(max(1, int(p.DialTimeout.Seconds()))))
		}
		u.RawQuery = q.Encode()
		driver, dsn, addr = "pgx", u.String(), u.Host+u.Path
	case StoreMySQL:
		service, setting = "MySQL/MariaDB", "MYSQL_DSN"
		mc, err := mysql.ParseDSN(or(p.DSN, MySQLDSN()))
		if err != nil {
			return nil, "", fmt.Errorf("testkit: MySQL DSN: %w", err)
		}
		if p.Addr != "" {
			mc.Addr = p.Addr
		}
		if mc.Timeout == 0 {
			mc.Timeout = p.DialTimeout
		}
		driver, dsn, addr = "mysql", mc.FormatDSN(), mc.Addr+"/"+mc.DBName
	}
	if conns <= 0 {
		conns = DefaultPoolSize
	}
	// A bounded pool: the servers are shared, and a router runs every
	// message in flight in its own goroutine.
	db, err := storeopen.OpenDB(ctx, driver, dsn, conns, pingTimeout(p.DialTimeout))
	if err != nil {
		return nil, "", &UnreachableError{Service: service, Addr: addr, Setting: setting, Err: err}
	}
	return db, addr, nil
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// closers runs cleanups in reverse order of registration, each whatever
// the others returned.
type closers []func(context.Context) error

func (c *closers) add(f func(context.Context) error) { *c = append(*c, f) }

func (c *closers) run(ctx context.Context) error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		if err := (*c)[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	*c = nil
	return errors.Join(errs...)
}

// pingTimeout is how long the first ping of an opened client may take.
func pingTimeout(dial time.Duration) time.Duration { return max(dial, minPingTimeout) }
