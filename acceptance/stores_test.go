package acceptance_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/natsclean"
	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/wsql3"
)

// memStore is the in-process store: no network (no outage scenario), one
// process only.
func memStore() acceptance.Store {
	return acceptance.Store{
		Name: "memstore",
		Open: func(t testing.TB, _ acceptance.Env) (acceptance.Opened, error) {
			return openStore(t, anystore.StoreParams{Kind: anystore.StoreMemory})
		},
	}
}

// openStore opens p with anystore.OpenStore, closing what it opened with
// t.Cleanup.
func openStore(t testing.TB, p anystore.StoreParams) (acceptance.Opened, error) {
	o, err := openTestkit(t, p)
	if err != nil {
		return acceptance.Opened{}, err
	}
	return acceptance.Opened{Store: o.Store}, nil
}

func openTestkit(t testing.TB, p anystore.StoreParams) (*anystore.OpenedStore, error) {
	o, cleanup, err := anystore.OpenStore(context.Background(), p)
	if err != nil {
		return nil, err
	}
	cleanupWithin(t, cleanup, "closing the %s store %s", p.Kind, o.Name)
	return o, nil
}

// openNamed opens the stores of p (Kind and settings) through
// env[EnvAddr], with a dial timeout of a second, under the name in
// env[name]: a key prefix, a bucket.
func openNamed(p anystore.StoreParams, name string) func(testing.TB, acceptance.Env) (acceptance.Opened, error) {
	return func(t testing.TB, env acceptance.Env) (acceptance.Opened, error) {
		p := p
		p.Addr, p.Name, p.DialTimeout = env[acceptance.EnvAddr], env[name], time.Second
		return openStore(t, p)
	}
}

// cleanupWithin runs cleanup when t ends, giving it 30 seconds, and logs
// its error after what (formatted with args).
func cleanupWithin(t testing.TB, cleanup func(context.Context) error, what string, args ...any) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cleanup(ctx); err != nil {
			t.Logf("%s: %v", fmt.Sprintf(what, args...), err)
		}
	})
}

// redisStore is redisstore on the shared Redis, under a key prefix unique
// to the scenario; its keys are deleted at the end.
func redisStore() acceptance.Store {
	return acceptance.Store{
		Name:         "redis",
		MultiProcess: true,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			addr := anystore.RequireStore(t, anystore.StoreRedis)
			prefix := "acceptance:" + id + ":"
			cleanupWithin(t, func(ctx context.Context) error {
				client := redis.NewClient(&redis.Options{Addr: addr})
				defer client.Close()
				return redisclean.DeletePrefix(ctx, client, prefix)
			}, "redis cleanup of %s*", prefix)
			return acceptance.Env{acceptance.EnvAddr: addr, "prefix": prefix}, nil
		},
		Open: openNamed(anystore.StoreParams{Kind: anystore.StoreRedis, Redis: redisstore.Config{SkipServerCheck: true}}, "prefix"),
	}
}

// redisAsyncStore is redisStore with middleware.Config.AsyncComplete:
// each message is acked once its handler succeeded, its Complete landing
// in the background.
func redisAsyncStore() acceptance.Store {
	s := redisStore()
	s.Name = "redis-async"
	s.AsyncComplete = true
	return s
}

// natsCurrentStore is natsstore on a nats-server of the current release
// (natstest.CurrentNATS) started for the scenario and killed at its end:
// records with TTLs of their own (natsstore.TTLPerKey), where the shared
// server's buckets expire them by their MaxAge. Every Open dials
// env[EnvAddr], the server or the outage scenario's proxy.
func natsCurrentStore() acceptance.Store {
	return acceptance.Store{
		Name:         "nats-current",
		MultiProcess: true,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			srv := natstest.CurrentNATS(t).Start(t, "")
			return acceptance.Env{acceptance.EnvAddr: srv.Addr(), "bucket": "acceptance_" + id}, nil
		},
		Open: openNamed(anystore.StoreParams{Kind: anystore.StoreNATS}, "bucket"),
	}
}

// natsStore is natsstore on the shared NATS server, in a KV bucket
// unique to the scenario, deleted at its end. Every Open dials
// env[EnvAddr], the server or the outage scenario's proxy.
func natsStore() acceptance.Store {
	return acceptance.Store{
		Name:         "nats",
		MultiProcess: true,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			addr := anystore.RequireStore(t, anystore.StoreNATS)
			bucket := "acceptance_" + id
			cleanupWithin(t, func(ctx context.Context) error {
				nc, err := nats.Connect("nats://" + addr)
				if err != nil {
					return err
				}
				defer nc.Close()
				return natsclean.DeleteBuckets(ctx, nc, natsstore.Config{Bucket: bucket})
			}, "nats cleanup of bucket %s", bucket)
			return acceptance.Env{acceptance.EnvAddr: addr, "bucket": bucket}, nil
		},
		Open: openNamed(anystore.StoreParams{Kind: anystore.StoreNATS}, "bucket"),
	}
}

// sqlStore is sqlstore on one dialect, in lease or transactional mode, in
// a table unique to the scenario. In transactional mode the business
// ledger is a ledger.SQL in the same database, written in the inbox
// transaction.
func sqlStore(d sqlstore.Dialect, transactional bool) acceptance.Store {
	mode := "lease"
	if transactional {
		mode = "tx"
	}
	return sqlStoreConfig(d, transactional, mode, sqlstore.Config{})
}

// sqlStoreJoinedTx is sqlstore in transactional mode joining a
// watermill-sql v3 subscriber's transaction (JoinTx: wsql3.SubscriberTx):
// on a watermill-sql pub/sub its inbox record is a savepoint in the
// subscriber's transaction, so offset ack, record and ledger commit
// together.
func sqlStoreJoinedTx(d sqlstore.Dialect) acceptance.Store {
	s := sqlStoreConfig(d, true, "tx-joined", sqlstore.Config{JoinTx: mustFind(wsql3.SubscriberTx)})
	s.JoinsSubscriberTx = true
	return s
}

// sqlKind is the testkit store kind of d.
func sqlKind(d sqlstore.Dialect) anystore.StoreKind {
	switch d {
	case sqlstore.Postgres:
		return anystore.StorePostgres
	case sqlstore.MySQL:
		return anystore.StoreMySQL
	}
	return anystore.StoreSQLite
}

// sqlParams are the testkit parameters of the database in env.
func sqlParams(d sqlstore.Dialect, env acceptance.Env) anystore.StoreParams {
	return anystore.StoreParams{
		Kind: sqlKind(d),
		Addr: env[acceptance.EnvAddr],
		Path: env["path"],
		Name: env["table"],
		// The database servers are shared with other tests, and a router
		// runs every message in flight in its own goroutine. SQLite: one
		// writer at a time, queued in Go rather than busy-waiting in
		// SQLite (the handlers use no connection besides the inbox one).
		PoolSize: maxConns(d),
	}
}

func maxConns(d sqlstore.Dialect) int {
	if d == sqlstore.SQLite {
		return 1
	}
	return 6
}

// sqlStoreConfig is sqlStore with cfg (Dialect and Table are set by
// testkit).
func sqlStoreConfig(d sqlstore.Dialect, transactional bool, mode string, cfg sqlstore.Config) acceptance.Store {
	return acceptance.Store{
		Name:          fmt.Sprintf("sql-%s-%s", d, mode),
		Transactional: transactional,
		MultiProcess:  d != sqlstore.SQLite,
		SingleWriter:  maxConns(d) == 1,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			env := acceptance.Env{"table": "dedup_" + id, "ledger": "ledger_" + id}
			if d == sqlstore.SQLite {
				env["path"] = filepath.Join(t.TempDir(), "dedup.db")
			} else {
				env[acceptance.EnvAddr] = anystore.RequireStore(t, sqlKind(d))
			}
			p := sqlParams(d, env)
			p.CreateSchema, p.Teardown = true, true
			o, err := openTestkit(t, p)
			if err != nil {
				return nil, err
			}
			// Idle until the cleanup: hold no connection of the shared
			// server meanwhile.
			o.DB.SetMaxIdleConns(0)
			l, err := ledger.NewSQL(o.DB, ledger.SQLConfig{Dialect: d, Table: env["ledger"]})
			if err != nil {
				return nil, err
			}
			if err := l.CreateTables(context.Background()); err != nil {
				return nil, err
			}
			t.Cleanup(func() { // before the store's cleanup: the database is open
				if err := l.DropTables(context.Background()); err != nil {
					t.Logf("sql cleanup: %v", err)
				}
			})
			return env, nil
		},
		Open: func(t testing.TB, env acceptance.Env) (acceptance.Opened, error) {
			p := sqlParams(d, env)
			p.SQL = cfg
			o, err := openTestkit(t, p)
			if err != nil {
				return acceptance.Opened{}, err
			}
			opened := acceptance.Opened{Store: o.Store}
			if transactional {
				// RequireTx: an effect written beside the inbox
				// transaction is a failure of the suite to see, not to
				// paper over.
				l, err := ledger.NewSQL(o.DB, ledger.SQLConfig{Dialect: d, Table: env["ledger"], RequireTx: true})
				if err != nil {
					return acceptance.Opened{}, err
				}
				opened.Ledger = l
			}
			return opened, nil
		},
	}
}

// openSQL opens the database of env, through env[EnvAddr]: for the
// watermill-sql pub/sub on the stores' database. The caller closes it.
func openSQL(d sqlstore.Dialect, env acceptance.Env) (*sql.DB, error) {
	p := sqlParams(d, env)
	p.Name = ""
	return anystore.OpenDB(context.Background(), p)
}

// dropTables drops the scenario's tables, and only those.
func dropTables(t testing.TB, d sqlstore.Dialect, env acceptance.Env, tables ...string) {
	if d == sqlstore.SQLite {
		return // the database is a file in the test's temporary directory
	}
	db, err := openSQL(d, env)
	if err != nil {
		t.Logf("sql cleanup: %v", err)
		return
	}
	defer db.Close()
	if err := sqltest.DropTables(context.Background(), db, d, tables...); err != nil {
		t.Logf("sql cleanup: %v", err)
	}
}
