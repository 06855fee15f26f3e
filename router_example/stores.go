package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// dedupStore is the configured store, and the database behind it when it
// is a SQL store (the ledger lives there too).
type dedupStore struct {
	store   stores.Store
	addr    string // where it is, for the summary (no secrets)
	db      *sql.DB
	dialect sqlstore.Dialect
	// ephemeral: the database goes away at exit (SQLite in a temporary
	// directory), so there is nothing to clean up in it.
	ephemeral bool
}

func dedupTable(runID string) string { return "dedup_" + runID }

// openStore opens the configured store. Closing is added to closers,
// dropping what it created to removers.
func openStore(ctx context.Context, cfg Config, runID string, logger watermill.LoggerAdapter, closers, removers *teardown) (*dedupStore, error) {
	switch cfg.Store {
	case storeMemory:
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			return nil, err
		}
		closers.add("close the memory store", s.Close)
		return &dedupStore{store: s, addr: "in-process"}, nil
	case storeRedis:
		return openRedisStore(ctx, cfg, runID, logger, closers, removers)
	case storePostgres, storeMySQL, storeSQLite:
		return openSQLStore(ctx, cfg, runID, logger, closers, removers)
	default:
		return nil, fmt.Errorf("unknown store %q (set -store)", cfg.Store)
	}
}

func openRedisStore(ctx context.Context, cfg Config, runID string, logger watermill.LoggerAdapter, closers, removers *teardown) (*dedupStore, error) {
	// Probed first: go-redis would log its failed dials before the error.
	if err := probeTCP(ctx, "Redis", cfg.RedisAddr, "-redis-addr or REDIS_ADDR"); err != nil {
		return nil, err
	}
	client := redis.NewClient(&redis.Options{
		Addr: cfg.RedisAddr,
		// The middleware's StoreTimeout then bounds every call.
		ContextTimeoutEnabled: true,
		DialTimeout:           dialTimeout,
		DialerRetries:         1,
		MaxRetries:            1,
	})
	closers.add("close the Redis client", func(context.Context) error { return client.Close() })
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		return nil, &unreachableError{"Redis", cfg.RedisAddr, "-redis-addr or REDIS_ADDR", err}
	}
	prefix := "dedup:" + runID + ":"
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, Logger: logger})
	if err != nil {
		return nil, err
	}
	closers.add("close the Redis store", s.Close)
	removers.add("delete Redis keys "+prefix+"*", func(ctx context.Context) error {
		return deleteRedisPrefix(ctx, client, prefix)
	})
	return &dedupStore{store: s, addr: cfg.RedisAddr}, nil
}

// deleteRedisPrefix deletes the keys this run wrote, and only those (never
// FLUSHDB a shared Redis).
func deleteRedisPrefix(ctx context.Context, client *redis.Client, prefix string) error {
	iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := client.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return client.Unlink(ctx, batch...).Err()
	}
	return nil
}

func openSQLStore(ctx context.Context, cfg Config, runID string, logger watermill.LoggerAdapter, closers, removers *teardown) (*dedupStore, error) {
	var (
		db   *sql.DB
		addr string
		err  error
	)
	if cfg.Store == storeSQLite {
		db, addr, err = openSQLite(ctx, cfg, closers)
		if cfg.Dir == "" {
			// The temporary directory goes, and everything in it.
			removers = &teardown{}
		}
	} else {
		db, addr, err = openDB(ctx, cfg, cfg.Store)
	}
	if err != nil {
		return nil, err
	}
	closers.add("close the "+cfg.Store+" store connection", func(context.Context) error { return db.Close() })
	s, err := sqlstore.New(db, sqlstore.Config{
		Table:  dedupTable(runID),
		Logger: logger,
		// Inside a watermill-sql subscriber's transaction the inbox record
		// joins it (offset ack, record and ledger commit together), but
		// only when that transaction is on this database. The example's
		// handlers are far shorter than the subscriber's AckDeadline,
		// which joining requires (see sqlstore.Config.JoinWatermillTx).
		JoinWatermillTx: cfg.Broker == cfg.Store,
	})
	if err != nil {
		return nil, err
	}
	closers.add("close the SQL store", s.Close)
	if err := s.CreateSchema(ctx); err != nil {
		return nil, fmt.Errorf("create the dedup table %s on %s: %w", s.Table(), addr, err)
	}
	removers.add("drop table "+s.Table(), func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.Table())
		return err
	})
	return &dedupStore{store: s, addr: addr, db: db, dialect: s.Dialect(), ephemeral: cfg.Store == storeSQLite && cfg.Dir == ""}, nil
}

// openSQLite opens the SQLite file in -dir, or in a temporary directory
// that is removed at exit.
func openSQLite(ctx context.Context, cfg Config, closers *teardown) (*sql.DB, string, error) {
	dir := cfg.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "router_example-")
		if err != nil {
			return nil, "", fmt.Errorf("create a temporary directory for SQLite (or set -dir): %w", err)
		}
		closers.add("remove "+tmp, func(context.Context) error { return os.RemoveAll(tmp) })
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", fmt.Errorf("-dir: %w", err)
	}
	path := filepath.Join(dir, "loyalty.db")
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(path))
	if err != nil {
		return nil, "", err
	}
	// SQLite has one writer at a time. One connection makes concurrent
	// handlers queue in database/sql instead of spinning in SQLite's busy
	// handler; no handler needs a second connection while it holds one
	// (in transactional mode its writes go through the inbox transaction).
	db.SetMaxOpenConns(1)
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, "", fmt.Errorf("open SQLite file %s (change -dir): %w", path, err)
	}
	return db, path, nil
}

// maxOpenConns bounds each connection pool the example opens.
const maxOpenConns = 8

// openDB opens and pings the PostgreSQL or MySQL database that -postgres-dsn
// or -mysql-dsn names. The address it returns has no password.
func openDB(ctx context.Context, cfg Config, kind string) (*sql.DB, string, error) {
	var (
		driver, dsn, addr, service, setting string
	)
	switch kind {
	case storePostgres:
		driver, dsn, service, setting = "pgx", cfg.PostgresDSN, "PostgreSQL", "-postgres-dsn or POSTGRES_DSN"
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", setting, err)
		}
		addr = fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
	case storeMySQL:
		driver, dsn, service, setting = "mysql", cfg.MySQLDSN, "MySQL/MariaDB", "-mysql-dsn or MYSQL_DSN"
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", setting, err)
		}
		addr = mc.Addr + "/" + mc.DBName
	default:
		return nil, "", fmt.Errorf("no database for %q", kind)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", setting, err)
	}
	// A bounded pool: handlers beyond it wait for a connection instead of
	// exhausting the server's max_connections, which other clients share.
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", dialTimeout)
		}
		return nil, "", &unreachableError{service, addr, setting, err}
	}
	return db, addr, nil
}
