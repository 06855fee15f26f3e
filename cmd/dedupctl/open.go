package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// dialTimeout bounds the probe of a service, as router_example's does.
const dialTimeout = 3 * time.Second

// admin is the store dedupctl works on.
type admin struct {
	stores.Admin
	// where says where the records are, for people: the service, its
	// address (no password) and the prefix or table.
	where string
	close func(context.Context) error
}

// unreachableError is a service that did not answer, or refused the
// connection.
type unreachableError struct {
	service, addr, setting string
	err                    error
}

func (e *unreachableError) Error() string {
	if refusal := serverRefusal(e.err); refusal != nil {
		return fmt.Sprintf("%s at %s refused the connection (check %s): %v", e.service, e.addr, e.setting, refusal)
	}
	cause := e.err
	var dial *net.OpError
	if errors.As(cause, &dial) {
		cause = dial
	}
	return fmt.Sprintf("%s is not reachable at %s (change it with %s): %v", e.service, e.addr, e.setting, cause)
}

func (e *unreachableError) Unwrap() error { return e.err }

// serverRefusal returns the error a server answered with, or nil when
// nothing answered.
func serverRefusal(err error) error {
	var (
		pg *pgconn.PgError
		my *mysql.MySQLError
		re redis.Error
	)
	switch {
	case errors.As(err, &pg):
		return pg
	case errors.As(err, &my):
		return my
	case errors.As(err, &re):
		return re
	}
	return nil
}

// probeTCP checks that something listens at addr before a client starts
// its own retries.
func probeTCP(ctx context.Context, service, addr, setting string) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return &unreachableError{service, addr, setting, err}
	}
	return c.Close()
}

// openStore opens the store the configuration names.
func openStore(ctx context.Context, c *config) (*admin, error) {
	if c.store == storeRedis {
		return openRedis(ctx, c)
	}
	return openSQL(ctx, c)
}

func openRedis(ctx context.Context, c *config) (*admin, error) {
	const setting = "-redis-addr or REDIS_ADDR"
	addrs := cliflag.SplitList(c.redisAddr)
	if len(addrs) == 0 {
		return nil, usagef("-redis-addr is empty")
	}
	if len(addrs) > 1 && !c.redisCluster {
		return nil, usagef("-redis-addr has %d addresses: add -redis-cluster for a Redis Cluster, or give one", len(addrs))
	}
	var (
		client  redis.UniversalClient
		service = "Redis"
		probed  error
	)
	for _, a := range addrs { // one node that answers is enough
		if probed = probeTCP(ctx, service, a, setting); probed == nil {
			break
		}
	}
	if probed != nil {
		return nil, probed
	}
	if c.redisCluster {
		service = "Redis Cluster"
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs, ContextTimeoutEnabled: true, DialTimeout: dialTimeout, MaxRetries: 1,
		})
	} else {
		client = redis.NewClient(&redis.Options{
			Addr: addrs[0], ContextTimeoutEnabled: true, DialTimeout: dialTimeout, DialerRetries: 1, MaxRetries: 1,
		})
	}
	fail := func(err error) (*admin, error) {
		_ = client.Close()
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		return fail(&unreachableError{service, c.redisAddr, setting, err})
	}
	if !c.redisCluster {
		// A node of a Cluster holds a part of the records only.
		info, err := client.Info(pctx, "cluster").Result()
		if err == nil && strings.Contains(info, "cluster_enabled:1") {
			return fail(usagef("the Redis at %s is a node of a Redis Cluster: add -redis-cluster", addrs[0]))
		}
	}
	s, err := redisstore.New(client, redisstore.Config{
		Prefix:               c.prefix(),
		CompactKeys:          c.compactKeys,
		DigestKeysLongerThan: c.digestKeysLongerThan,
		SkipServerCheck:      true,
		Batch:                redisstore.BatchConfig{Disabled: true},
	})
	if err != nil {
		return fail(usagef("%v", err))
	}
	prefix := c.prefix()
	if prefix == "" {
		prefix = redisstore.DefaultPrefix
		if c.compactKeys {
			prefix = redisstore.DefaultCompactPrefix
		}
	}
	return &admin{
		Admin: s,
		where: fmt.Sprintf("%s %s, prefix %q", service, c.redisAddr, prefix),
		close: func(ctx context.Context) error {
			return errors.Join(s.Close(ctx), client.Close())
		},
	}, nil
}

func openSQL(ctx context.Context, c *config) (*admin, error) {
	var (
		driver, dsn, addr, service, setting string
		dialect                             sqlstore.Dialect
	)
	switch c.store {
	case storePostgres:
		driver, dsn, service, setting, dialect = "pgx", c.postgresDSN, "PostgreSQL", "-postgres-dsn or POSTGRES_DSN", sqlstore.Postgres
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, usagef("%s: %v", setting, err)
		}
		addr = fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
	case storeMySQL:
		driver, dsn, service, setting, dialect = "mysql", c.mysqlDSN, "MySQL/MariaDB", "-mysql-dsn or MYSQL_DSN", sqlstore.MySQL
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, usagef("%s: %v", setting, err)
		}
		addr = mc.Addr + "/" + mc.DBName
	default:
		path := c.sqliteFile
		if path == "" {
			path = filepath.Join(c.dir, sqliteFile)
		}
		// Opening a file that does not exist would create it.
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("no SQLite database at %s (change -sqlite-file or -dir)", path)
			}
			return nil, fmt.Errorf("SQLite database %s: %w", path, err)
		}
		driver, dsn, addr, service, setting, dialect = "sqlite", sqlstore.SQLiteDSN(path), path, "SQLite", "-sqlite-file or -dir", sqlstore.SQLite
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, usagef("%s: %v", setting, err)
	}
	db.SetMaxOpenConns(2)
	fail := func(err error) (*admin, error) {
		_ = db.Close()
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", dialTimeout)
		}
		return fail(&unreachableError{service, addr, setting, err})
	}
	st, err := sqlstore.New(db, sqlstore.Config{
		Dialect:    dialect,
		Table:      c.tableName(),
		PurgeGrace: c.purgeGrace,
		Batch:      sqlstore.BatchConfig{Disabled: true},
	})
	if err != nil {
		return fail(usagef("-table: %v", err))
	}
	// A table name that passed sqlstore's check needs no quoting.
	if _, err := db.ExecContext(pctx, "SELECT 1 FROM "+st.Table()+" WHERE 1 = 0"); err != nil {
		return fail(fmt.Errorf("cannot read the table %s on %s %s (does it exist? change -table or -run-id): %w", st.Table(), service, addr, err))
	}
	return &admin{
		Admin: st,
		where: fmt.Sprintf("%s %s, table %s", service, addr, st.Table()),
		close: func(ctx context.Context) error {
			return errors.Join(st.Close(ctx), db.Close())
		},
	}, nil
}
