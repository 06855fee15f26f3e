// Package storeopen opens the dedup stores from settings: the one place
// anystore.OpenStore, router_example and cmd/dedupctl build a store. Each
// kind of store ("memory", "redis", "postgres", "mysql", "sqlite",
// "nats") is a Kind registered once, in kinds.go, and defined in a file
// of its own here: its flags, its checks, how it connects, builds its
// store and is closed. Opener.Open opens one.
//
// It connects to Redis (one server or a Redis Cluster), PostgreSQL,
// MySQL/MariaDB, SQLite and NATS, pings them, and reports a service that
// cannot be used with its address and the flag and environment variable
// that change it, saying whether nothing answered or the server refused.
// router_example's brokers use the same connections.
//
// The library (stores/..., the middleware, the publisher) never imports
// it: it imports the stores.
package storeopen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/watermill-dedup/dedup/internal/sqlpool"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// DialTimeout bounds the probe, the first ping and each connection attempt
// of every service.
const DialTimeout = 3 * time.Second

// The settings that move each store's service, as both programs name them
// (the flag, then its environment variable).
const (
	RedisSetting    = "-redis-addr or REDIS_ADDR"
	PostgresSetting = "-postgres-dsn or POSTGRES_DSN"
	MySQLSetting    = "-mysql-dsn or MYSQL_DSN"
	SQLiteSetting   = "-sqlite-file or -dir"
)

// Opener opens connections the way one program does.
type Opener struct {
	// MaxConns bounds each SQL pool it opens, open and idle connections
	// alike: the servers are shared.
	MaxConns int

	// Check is what a server's refusal asks to check in the setting (see
	// UnreachableError.Check).
	Check string

	// SQLiteConns is the pool of a SQLite file (default 1: SQLite has one
	// writer at a time, and one connection makes concurrent handlers
	// queue in database/sql instead of spinning in its busy handler).
	SQLiteConns int

	// TempDir is the pattern of the temporary directory of a SQLite file
	// the settings do not name (os.MkdirTemp's; default "dedup-sqlite-").
	TempDir string

	// DialTimeout bounds each connection attempt, PingTimeout the first
	// ping, which proves the service is up. Default: DialTimeout, both.
	DialTimeout, PingTimeout time.Duration

	// RedisOptions and RedisClusterOptions, if set, adjust the go-redis
	// client's options last, before the client is made.
	RedisOptions        func(*redis.Options)
	RedisClusterOptions func(*redis.ClusterOptions)

	// NATSOptions are added to the NATS connection's options (after
	// its time-out and credentials).
	NATSOptions []nats.Option

	// SettingNames renames the settings errors name, for a program that
	// names them otherwise: the key is this package's name
	// (RedisSetting, "-redis-addr or REDIS_ADDR"), the value the
	// program's.
	SettingNames map[string]string
}

func (o Opener) dialTimeout() time.Duration {
	if o.DialTimeout > 0 {
		return o.DialTimeout
	}
	return DialTimeout
}

func (o Opener) pingTimeout() time.Duration {
	if o.PingTimeout > 0 {
		return o.PingTimeout
	}
	return DialTimeout
}

// Redis connects to the Redis at addrs[0] or, with cluster, to the Redis
// Cluster of whose nodes addrs lists some, and pings it: OpenRedis with
// the addresses (host:port, or URLs; see RedisConfig). It probes the
// addresses first, one answering is enough: go-redis would log its failed
// dials before the error. Every call is bounded by the caller's context
// (ContextTimeoutEnabled), and a failed one is retried once. A service
// that does not answer or refuses is an *UnreachableError naming
// -redis-addr.
func (o Opener) Redis(ctx context.Context, addrs []string, cluster bool) (redis.UniversalClient, error) {
	if len(addrs) == 0 {
		return nil, errors.New("storeopen: no Redis address")
	}
	client, _, err := o.OpenRedis(ctx, RedisConfig{Addr: strings.Join(addrs, ","), Cluster: cluster})
	return client, err
}

// DB opens and pings the PostgreSQL (d is sqlstore.Postgres) or
// MySQL/MariaDB (sqlstore.MySQL) database dsn names, the value of
// -postgres-dsn or -mysql-dsn. It returns the database and its address
// without a password, host:port/database. A DSN that does not parse is a
// *SettingError; a server that does not answer or refuses, an
// *UnreachableError.
func (o Opener) DB(ctx context.Context, d sqlstore.Dialect, dsn string) (*sql.DB, string, error) {
	var driver, addr, service, setting string
	switch d {
	case sqlstore.Postgres:
		driver, service, setting = "pgx", "PostgreSQL", PostgresSetting
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, "", &SettingError{setting, err}
		}
		addr = fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
	case sqlstore.MySQL:
		driver, service, setting = "mysql", "MySQL/MariaDB", MySQLSetting
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, "", &SettingError{setting, err}
		}
		addr = mc.Addr + "/" + mc.DBName
	default:
		return nil, "", fmt.Errorf("storeopen: no database server for dialect %q", d)
	}
	db, err := sqlpool.Open(ctx, driver, dsn, o.MaxConns, o.pingTimeout())
	if err != nil {
		if d == sqlstore.Postgres && notPostgres(err) {
			err = &ProtocolError{Service: service, Err: err}
		}
		return nil, "", o.unreachable(service, addr, setting, err)
	}
	return db, addr, nil
}

// notPostgres reports whether err is pgx's of a server that answered,
// but not with the PostgreSQL protocol: a message PostgreSQL never sends
// (pgx: "received unexpected message: %!w(<nil>)", MySQL/MariaDB's
// greeting), or a message length no PostgreSQL message has (the text
// NATS and RabbitMQ send).
func notPostgres(err error) bool {
	var tooLong *pgproto3.ExceededMaxBodyLenErr
	return errors.As(err, &tooLong) || strings.Contains(err.Error(), "received unexpected message")
}

// ProtocolError is a server that answered, but not with the protocol of
// Service: another service listens at the address.
type ProtocolError struct {
	Service string // the service expected: "PostgreSQL"
	Err     error  // the client's error, which may not say so
}

func (e *ProtocolError) Error() string {
	return "a server answered there, but not with the " + e.Service +
		" protocol: another service listens at that port (is the port right?)"
}

func (e *ProtocolError) Unwrap() error { return e.Err }

func (o Opener) unreachable(service, addr, setting string, err error) error {
	return &UnreachableError{Service: service, Addr: addr, Setting: setting, Check: o.Check, Err: err}
}

// UnreachableError says which service could not be used, at which
// address, and which setting changes it: either nothing answered there,
// or the server answered and refused (a wrong password, an unknown role,
// database or virtual host), or another service answered (a
// *ProtocolError in Err).
type UnreachableError struct {
	Service string // "PostgreSQL"
	Addr    string // where, without a password
	Setting string // what changes it: "-postgres-dsn or POSTGRES_DSN"

	// Check, when set, is what a refusal asks to check in Setting: "user,
	// password and database" says "check the user, password and database
	// in -postgres-dsn or POSTGRES_DSN". Empty: "check" Setting.
	Check string

	Err error
}

func (e *UnreachableError) Error() string {
	if refusal := ServerRefusal(e.Err); refusal != nil {
		what := e.Setting
		if e.Check != "" {
			what = "the " + e.Check + " in " + e.Setting
		}
		return fmt.Sprintf("%s at %s refused the connection (check %s): %v", e.Service, e.Addr, what, refusal)
	}
	var wrong *ProtocolError
	if errors.As(e.Err, &wrong) {
		return fmt.Sprintf("no %s at %s (change it with %s): %v", e.Service, e.Addr, e.Setting, wrong)
	}
	// The dial error alone: a client may list every attempt, on lines of
	// their own.
	cause := e.Err
	var dial *net.OpError
	if errors.As(cause, &dial) {
		cause = dial
	}
	return fmt.Sprintf("%s is not reachable at %s (change it with %s): %v", e.Service, e.Addr, e.Setting, cause)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ServerRefusal returns the error a server answered with, found in err's
// chain: PostgreSQL's, MySQL's, Redis's, NATS's or RabbitMQ's
// (router_example's broker). It returns nil when err is not one: nothing answered, or a
// timeout.
func ServerRefusal(err error) error {
	if r := natsRefusal(err); r != nil {
		return r // see nats.go
	}
	var (
		pg   *pgconn.PgError
		my   *mysql.MySQLError
		amqp *amqp091.Error
		re   redis.Error
	)
	switch {
	case errors.As(err, &pg):
		return pg
	case errors.As(err, &my):
		return my
	case errors.As(err, &amqp) && (amqp.Server || amqp.Code == amqp091.AccessRefused):
		// amqp091 reports its own failures as an *amqp091.Error too (a
		// handshake that timed out, a connection closed under it): only
		// what the server sent, and the refusals amqp091 makes of the
		// server closing the handshake (ErrCredentials, ErrVhost,
		// ErrSASL, all ACCESS_REFUSED), are refusals.
		return amqp
	case errors.As(err, &re):
		return re
	}
	return nil
}

// SettingError is a setting that does not parse (a DSN), or settings a
// store refuses.
type SettingError struct {
	Setting string // "-postgres-dsn or POSTGRES_DSN"; empty when Err names them
	Err     error
}

func (e *SettingError) Error() string {
	if e.Setting == "" {
		return e.Err.Error() // the error names the settings itself
	}
	return e.Setting + ": " + e.Err.Error()
}

func (e *SettingError) Unwrap() error { return e.Err }

// ProbeTCP checks that something listens at addr before a client library
// starts its own (sometimes endless) reconnect loop. It waits DialTimeout
// at most; nothing listening is an *UnreachableError.
func ProbeTCP(ctx context.Context, service, addr, setting string) error {
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return &UnreachableError{Service: service, Addr: addr, Setting: setting, Err: err}
	}
	return c.Close()
}
