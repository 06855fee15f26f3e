// Package storeopen opens the connections a dedup store runs on, from the
// settings of a command line: the one opener of router_example and
// cmd/dedupctl (and of testkit's SQL databases). It connects to Redis (one
// server or a Redis Cluster) and to PostgreSQL, MySQL/MariaDB and SQLite,
// pings them, and reports a service that cannot be used with its address
// and the flag and environment variable that change it, saying whether
// nothing answered or the server refused. Each program builds its store
// on what it opened, with its own store configuration.
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
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

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
)

// Opener opens connections the way one program does.
type Opener struct {
	// MaxConns bounds each SQL pool it opens, open and idle connections
	// alike: the servers are shared.
	MaxConns int

	// Check is what a server's refusal asks to check in the setting (see
	// UnreachableError.Check).
	Check string
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
	db, err := OpenDB(ctx, driver, dsn, o.MaxConns, DialTimeout)
	if err != nil {
		return nil, "", o.unreachable(service, addr, setting, err)
	}
	return db, addr, nil
}

// OpenDB opens a database/sql pool of conns connections (open and idle;
// none: database/sql's default) and pings it within timeout. It returns
// the ping's error, "no answer within" timeout when that passed, and
// leaves nothing open then.
func OpenDB(ctx context.Context, driver, dsn string, conns int, timeout time.Duration) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	if conns > 0 {
		// A bounded pool: handlers beyond it wait for a connection
		// instead of exhausting the server's max_connections, which
		// other clients share.
		db.SetMaxOpenConns(conns)
		db.SetMaxIdleConns(conns)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", timeout)
		}
		return nil, err
	}
	return db, nil
}

func (o Opener) unreachable(service, addr, setting string, err error) error {
	return &UnreachableError{Service: service, Addr: addr, Setting: setting, Check: o.Check, Err: err}
}

// UnreachableError says which service could not be used, at which
// address, and which setting changes it: either nothing answered there,
// or the server answered and refused (a wrong password, an unknown role,
// database or virtual host).
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

// SettingError is a setting that does not parse: a DSN.
type SettingError struct {
	Setting string // "-postgres-dsn or POSTGRES_DSN"
	Err     error
}

func (e *SettingError) Error() string { return e.Setting + ": " + e.Err.Error() }

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
