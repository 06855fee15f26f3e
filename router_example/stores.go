package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
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

// A run's records are under names of the example's own, which no store
// configured with its defaults reads (redisstore's prefix "dedup:",
// sqlstore's table dedup_inbox): a tool reading such a store, such as
// cmd/dedupctl, finds the store's records only, and need not tell a
// run's keys from them. cmd/dedupctl's -run-id names the same.
func redisPrefix(runID string) string { return redisRunsPrefix + runID + ":" }

// redisRunsPrefix starts the keys of every run: an ACL user of the
// example needs its keys (~router_example:*).
const redisRunsPrefix = "router_example:"

func dedupTable(runID string) string { return "router_example_" + runID }

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
	client, target, err := openRedis(ctx, cfg)
	if err != nil {
		return nil, err
	}
	closers.add("close the Redis client", func(context.Context) error { return client.Close() })
	prefix := redisPrefix(runID)
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, Logger: logger})
	if err != nil {
		return nil, err
	}
	closers.add("close the Redis store", s.Close)
	if err := refuseUsedRunID(ctx, s, runID, "the Redis at "+target.Display+" (keys "+prefix+"*)"); err != nil {
		return nil, err
	}
	if cfg.Dedup { // without the middleware the run writes no key
		removers.add("delete Redis keys "+prefix+"*", func(ctx context.Context) error {
			return storeopen.DeleteRedisPrefix(ctx, client, prefix)
		})
	}
	return &dedupStore{store: s, addr: target.Display}, nil
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
	// Inside a watermill-sql subscriber's transaction the inbox record
	// joins it (offset ack, record and ledger commit together), but only
	// when that transaction is on this database. The subscriber is
	// wsql3.NewSubscriber's (see brokers.go), which SubscriberTx requires.
	var joinTx sqlstore.TxFinder
	if cfg.Broker == cfg.Store {
		joinTx = wsql3.SubscriberTx
	}
	s, err := sqlstore.New(db, sqlstore.Config{
		Table:  dedupTable(runID),
		Logger: logger,
		JoinTx: joinTx,
	})
	if err != nil {
		return nil, err
	}
	closers.add("close the SQL store", s.Close)
	if err := s.CreateSchema(ctx); err != nil {
		return nil, fmt.Errorf("create the dedup table %s on %s: %w", s.Table(), addr, err)
	}
	if err := refuseUsedRunID(ctx, s, runID, "the table "+s.Table()+" of "+addr); err != nil {
		return nil, err
	}
	if err := refuseUsedLedger(ctx, db, runID, addr); err != nil {
		return nil, err
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
	// SQLite has one writer at a time. One connection makes concurrent
	// handlers queue in database/sql instead of spinning in SQLite's busy
	// handler; no handler needs a second connection while it holds one
	// (in transactional mode its writes go through the inbox transaction).
	db, err := storeopen.OpenDB(ctx, "sqlite", sqlstore.SQLiteDSN(path), 1, dialTimeout)
	if err != nil {
		return nil, "", fmt.Errorf("open SQLite file %s (change -dir): %w", path, err)
	}
	return db, path, nil
}

// openRedis connects to -redis-addr and pings it. go-redis bounds the
// ping by the context's deadline only (3s): await ends the wait at once
// on a signal.
func openRedis(ctx context.Context, cfg Config) (redis.UniversalClient, *storeopen.RedisTarget, error) {
	type opened struct {
		client redis.UniversalClient
		target *storeopen.RedisTarget
	}
	o, err := await(ctx, "connecting to Redis at "+storeopen.RedactRedis(cfg.RedisAddr), func() (opened, error) {
		c, t, err := connect.OpenRedis(ctx, storeopen.RedisConfig{Addr: cfg.RedisAddr, TLS: cfg.RedisTLS})
		return opened{c, t}, err
	}, func(o opened) { _ = o.client.Close() })
	return o.client, o.target, err
}

// connect opens the connections of the store and of the SQL pub/subs:
// bounded pools, and errors that name the flag to change and, when a
// server refused, the credentials to check.
var connect = storeopen.Opener{MaxConns: 8, Check: "user, password and database"}

// openDB opens and pings the PostgreSQL or MySQL database that -postgres-dsn
// or -mysql-dsn names. The address it returns has no password.
func openDB(ctx context.Context, cfg Config, kind string) (*sql.DB, string, error) {
	switch kind {
	case storePostgres:
		return connect.DB(ctx, sqlstore.Postgres, cfg.PostgresDSN)
	case storeMySQL:
		return connect.DB(ctx, sqlstore.MySQL, cfg.MySQLDSN)
	}
	return nil, "", fmt.Errorf("no database for %q", kind)
}
