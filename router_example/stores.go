package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
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
	path      string // the SQLite file; "" for the other stores
}

// A run's records are under names of the example's own, which no store
// configured with its defaults reads (redisstore's prefix "dedup:",
// sqlstore's table dedup_inbox, natsstore's bucket dedup): a tool reading such a store, such as
// cmd/dedupctl, finds the store's records only, and need not tell a
// run's keys from them. cmd/dedupctl's -run-id names the same: both are
// the store kinds' RunName.
func redisPrefix(runID string) string { return runName(storeRedis, runID) }

// redisRunsPrefix starts the keys of every run: an ACL user of the
// example needs its keys (~router_example:*).
const redisRunsPrefix = "router_example:"

func dedupTable(runID string) string { return runName(storePostgres, runID) }

// runName is where the run runID keeps its records on the store kind.
func runName(kind, runID string) string {
	k, ok := storeopen.Lookup(kind)
	if !ok {
		return ""
	}
	return k.RunName(runID)
}

// openStore opens the configured store, through storeopen's registry,
// under the run's name. Closing is added to closers, dropping what it
// created to removers.
func openStore(ctx context.Context, cfg Config, runID string, logger watermill.LoggerAdapter, closers, removers *teardown) (*dedupStore, error) {
	r := storeopen.Request{Settings: cfg.storeSettings(), Name: runName(cfg.Store, runID), Logger: logger, CreateSchema: true}
	if isSQLStore(cfg.Store) {
		// Inside a watermill-sql subscriber's transaction the inbox record
		// joins it (offset ack, record and ledger commit together), but
		// only when that transaction is on this database. The subscriber
		// is wsql3.NewSubscriber's (see brokers.go), which SubscriberTx
		// requires.
		var joinTx sqlstore.TxFinder
		if cfg.Broker == cfg.Store {
			joinTx = wsql3.SubscriberTx
		}
		r.Config = sqlstore.Config{JoinTx: joinTx}
	}
	if cfg.Store == storeNATS {
		// natsstore refuses a lease or a retention above its MaxLease and
		// MaxRetention (1h and 24h by default), and keeps a bucket's
		// records for as long as the larger of them needs: the run's.
		r.Config = natsstore.Config{MaxLease: max(cfg.Lease, natsstore.DefaultMaxLease), MaxRetention: cfg.Retention}
	}
	// Connecting may hang on a service that says nothing: await ends the
	// wait at once on a signal.
	o, err := await(ctx, "opening the "+cfg.Store+" store", func() (*storeopen.Opened, error) {
		return connect.Open(ctx, cfg.Store, r)
	}, func(o *storeopen.Opened) { _ = o.Close(context.Background()) })
	if errors.Is(err, natsstore.ErrBucketConfig) {
		// The bucket has the run's name: an earlier run of that id made
		// it, with other -lease or -retention.
		return nil, &runIDUsedError{RunID: runID, What: fmt.Sprintf("the NATS at %s has its bucket %s, made for another -lease or -retention",
			storeopen.RedactNATSURL(cfg.NATSURL), r.Name)}
	}
	if err != nil {
		return nil, err
	}
	closers.add("close the "+cfg.Store+" store", o.Close)
	where := fmt.Sprintf("the %s at %s (%s)", o.Service, o.Addr, o.Records)
	// A consumer process of -processes shares its run's store, which its
	// parent opened and checked: the records there are that run's.
	if cfg.ConsumerProcess > 0 {
		return &dedupStore{store: o.Store, addr: o.Addr, db: o.DB, dialect: o.Kind.Dialect, path: o.Path}, nil
	}
	if err := refuseUsedRunID(ctx, o.Store, runID, where); err != nil {
		return nil, err
	}
	if cfg.Dedup {
		if err := probeClaim(ctx, o.Store, cfg.Lease, runID, where); err != nil {
			return nil, err
		}
	}
	if o.DB != nil {
		if err := refuseUsedLedger(ctx, o.DB, runID, o.Addr); err != nil {
			return nil, err
		}
	}
	// A temporary directory goes at exit, and everything in it. Without
	// the middleware a run writes no record: only a table or a bucket it
	// created (the SQL stores and natsstore make theirs when opened) is
	// left to drop.
	if o.Removal != "" && o.TempDir == "" && (cfg.Dedup || o.DB != nil || o.NATS != nil) {
		removers.add(o.Removal, o.Remove)
	}
	return &dedupStore{store: o.Store, addr: o.Addr, db: o.DB, dialect: o.Kind.Dialect, ephemeral: o.TempDir != "", path: o.Path}, nil
}

// openRedis connects to -redis-addr and pings it, for the Redis Streams
// broker. go-redis bounds the ping by the context's deadline only (3s):
// await ends the wait at once on a signal.
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

// connect opens the connections of the store and of the brokers: bounded
// pools, and errors that name the flag to change and, when a server
// refused, the credentials to check.
var connect = storeopen.Opener{
	MaxConns:     8,
	Check:        "user, password and database",
	SettingNames: map[string]string{storeopen.SQLiteSetting: "-dir"},
	TempDir:      "router_example-",
}

// openDB opens and pings the PostgreSQL or MySQL database that -postgres-dsn
// or -mysql-dsn names, for the SQL brokers. The address it returns has no
// password.
func openDB(ctx context.Context, cfg Config, kind string) (*sql.DB, string, error) {
	switch kind {
	case storePostgres:
		return connect.DB(ctx, sqlstore.Postgres, cfg.PostgresDSN)
	case storeMySQL:
		return connect.DB(ctx, sqlstore.MySQL, cfg.MySQLDSN)
	}
	return nil, "", fmt.Errorf("no database for %q", kind)
}
