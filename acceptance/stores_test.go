package acceptance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver "pgx"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // SQLite driver "sqlite"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/testkit"
)

// memStore is the in-process store: no network (no outage scenario), one
// process only.
func memStore() acceptance.Store {
	return acceptance.Store{
		Name: "memstore",
		Open: func(testing.TB, acceptance.Env) (acceptance.Opened, error) {
			s, err := memstore.New(memstore.Config{})
			return acceptance.Opened{Store: s}, err
		},
	}
}

// redisStore is redisstore on the shared Redis, under a key prefix unique
// to the scenario; its keys are deleted at the end.
func redisStore() acceptance.Store {
	return acceptance.Store{
		Name:         "redis",
		MultiProcess: true,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			addr := testkit.RequireRedis(t)
			prefix := "acceptance:" + id + ":"
			t.Cleanup(func() { deleteRedisPrefix(t, addr, prefix) })
			return acceptance.Env{acceptance.EnvAddr: addr, "prefix": prefix}, nil
		},
		Open: func(t testing.TB, env acceptance.Env) (acceptance.Opened, error) {
			client := redis.NewClient(&redis.Options{
				Addr:                  env[acceptance.EnvAddr],
				ContextTimeoutEnabled: true,
				DialTimeout:           time.Second,
				PoolTimeout:           2 * time.Second,
			})
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, redisstore.Config{Prefix: env["prefix"], SkipServerCheck: true})
			return acceptance.Opened{Store: s}, err
		},
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

// deleteRedisPrefix deletes the keys under prefix, and only those.
func deleteRedisPrefix(t testing.TB, addr, prefix string) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("redis cleanup of %s*: %v", prefix, err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := client.Del(ctx, keys[:n]...).Err(); err != nil {
			t.Logf("redis cleanup of %s*: %v", prefix, err)
			return
		}
		keys = keys[n:]
	}
}

// sqlStore is sqlstore on one dialect, in lease or transactional mode, in
// a table unique to the scenario. In transactional mode the business
// ledger is a table of the same database, written in the inbox
// transaction.
func sqlStore(d sqlstore.Dialect, transactional bool) acceptance.Store {
	mode := "lease"
	if transactional {
		mode = "tx"
	}
	return sqlStoreConfig(d, transactional, mode, sqlstore.Config{})
}

// sqlStoreJoinedTx is sqlstore in transactional mode with
// JoinWatermillTx: on a watermill-sql pub/sub its inbox record is a
// savepoint in the subscriber's transaction, so offset ack, record and
// ledger commit together.
func sqlStoreJoinedTx(d sqlstore.Dialect) acceptance.Store {
	return sqlStoreConfig(d, true, "tx-joined", sqlstore.Config{JoinWatermillTx: true})
}

// sqlStoreConfig is sqlStore with cfg (Dialect and Table are set here).
func sqlStoreConfig(d sqlstore.Dialect, transactional bool, mode string, cfg sqlstore.Config) acceptance.Store {
	return acceptance.Store{
		Name:          fmt.Sprintf("sql-%s-%s", d, mode),
		Transactional: transactional,
		MultiProcess:  d != sqlstore.SQLite,
		Setup: func(t *testing.T, id string) (acceptance.Env, error) {
			env := acceptance.Env{"table": "dedup_" + id, "ledger": "ledger_" + id}
			if d == sqlstore.SQLite {
				env["path"] = filepath.Join(t.TempDir(), "dedup.db")
			} else {
				addr, err := sqlServer(t, d)
				if err != nil {
					return nil, err
				}
				env[acceptance.EnvAddr] = addr
			}
			db, err := openSQL(d, env)
			if err != nil {
				return nil, err
			}
			defer db.Close()
			s, err := sqlstore.New(db, sqlstore.Config{Dialect: d, Table: env["table"]})
			if err != nil {
				return nil, err
			}
			defer s.Close(context.Background())
			ctx := context.Background()
			if err := s.CreateSchema(ctx); err != nil {
				return nil, fmt.Errorf("create schema: %w", err)
			}
			if _, err := db.ExecContext(ctx, ledgerDDL(d, env["ledger"])); err != nil {
				return nil, fmt.Errorf("create ledger: %w", err)
			}
			t.Cleanup(func() { dropTables(t, d, env, env["table"], env["ledger"]) })
			return env, nil
		},
		Open: func(t testing.TB, env acceptance.Env) (acceptance.Opened, error) {
			db, err := openSQL(d, env)
			if err != nil {
				return acceptance.Opened{}, err
			}
			t.Cleanup(func() { _ = db.Close() })
			c := cfg // per call: scenarios open stores concurrently
			c.Dialect, c.Table = d, env["table"]
			s, err := sqlstore.New(db, c)
			if err != nil {
				return acceptance.Opened{}, err
			}
			o := acceptance.Opened{Store: s}
			if transactional {
				o.Ledger = &sqlLedger{db: db, d: d, table: env["ledger"]}
			}
			return o, nil
		},
	}
}

// sqlServer returns the host:port of the PostgreSQL or MySQL server
// (skipping the test loudly, or failing it in CI, when it is down).
func sqlServer(t testing.TB, d sqlstore.Dialect) (string, error) {
	if d == sqlstore.MySQL {
		cfg, err := mysql.ParseDSN(testkit.RequireMySQL(t))
		if err != nil {
			return "", err
		}
		return cfg.Addr, nil
	}
	u, err := url.Parse(testkit.RequirePostgres(t))
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// openSQL opens the database of env, through env[EnvAddr].
func openSQL(d sqlstore.Dialect, env acceptance.Env) (*sql.DB, error) {
	switch d {
	case sqlstore.Postgres:
		u, err := url.Parse(testkit.PostgresDSN())
		if err != nil {
			return nil, err
		}
		u.Host = env[acceptance.EnvAddr]
		q := u.Query()
		q.Set("connect_timeout", "2")
		u.RawQuery = q.Encode()
		return boundPool(sql.Open("pgx", u.String()))
	case sqlstore.MySQL:
		cfg, err := mysql.ParseDSN(testkit.MySQLDSN())
		if err != nil {
			return nil, err
		}
		cfg.Addr = env[acceptance.EnvAddr]
		cfg.Timeout = 2 * time.Second
		return boundPool(sql.Open("mysql", cfg.FormatDSN()))
	case sqlstore.SQLite:
		db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(env["path"]))
		if err != nil {
			return nil, err
		}
		// One writer at a time: queue in Go rather than busy-wait in
		// SQLite (the handlers use no connection besides the inbox one).
		db.SetMaxOpenConns(sqliteConns)
		return db, nil
	}
	return nil, fmt.Errorf("unknown dialect %q", d)
}

// sqliteConns bounds a SQLite pool.
const sqliteConns = 1

// maxConns bounds each pool: the database servers are shared with other
// tests, and a router runs every message in flight in its own goroutine.
const maxConns = 6

func boundPool(db *sql.DB, err error) (*sql.DB, error) {
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db, nil
}

func ledgerDDL(d sqlstore.Dialect, table string) string {
	switch d {
	case sqlstore.Postgres:
		return `CREATE TABLE ` + table + ` (seq BIGSERIAL PRIMARY KEY, event VARCHAR(255) NOT NULL)`
	case sqlstore.MySQL:
		return "CREATE TABLE `" + table + "` (seq BIGINT AUTO_INCREMENT PRIMARY KEY, event VARCHAR(255) NOT NULL) ENGINE = InnoDB"
	default:
		return `CREATE TABLE ` + table + ` (seq INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT NOT NULL)`
	}
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
	for _, table := range tables {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + quoteIdent(d, table)); err != nil {
			t.Logf("sql cleanup: drop %s: %v", table, err)
		}
	}
}

func quoteIdent(d sqlstore.Dialect, name string) string {
	if d == sqlstore.MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// sqlLedger is the business ledger of the transactional mode: one row per
// effect, written in the inbox transaction.
type sqlLedger struct {
	db    *sql.DB
	d     sqlstore.Dialect
	table string
}

var errNoTx = errors.New("ledger: no inbox transaction in the handler's context")

func (l *sqlLedger) Apply(ctx context.Context, event string) error {
	tx, ok := sqlstore.TxFromContext(ctx)
	if !ok {
		return errNoTx
	}
	ph := "?"
	if l.d == sqlstore.Postgres {
		ph = "$1"
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+quoteIdent(l.d, l.table)+" (event) VALUES ("+ph+")", event)
	return err
}

func (l *sqlLedger) Effects(ctx context.Context) ([]string, error) {
	rows, err := l.db.QueryContext(ctx, "SELECT event FROM "+quoteIdent(l.d, l.table)+" ORDER BY seq")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
