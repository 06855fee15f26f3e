package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// admin is the store dedupctl works on.
type admin struct {
	stores.Admin
	// where says where the records are, for people: the service, its
	// address (no password) and the prefix or table.
	where string
	close func(context.Context) error
}

// connect opens the connections: a pool of two is enough for one command
// at a time.
var connect = storeopen.Opener{MaxConns: 2}

// openStore opens the store the configuration names.
func openStore(ctx context.Context, c *config) (*admin, error) {
	switch c.store {
	case storeRedis:
		return openRedis(ctx, c)
	case storeNATS:
		return openNATS(ctx, c)
	}
	return openSQL(ctx, c)
}

func openRedis(ctx context.Context, c *config) (*admin, error) {
	client, target, err := connect.OpenRedis(ctx, storeopen.RedisConfig{Addr: c.redisAddr, Cluster: c.redisCluster, TLS: c.redisTLS})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*admin, error) {
		_ = client.Close()
		return nil, err
	}
	service := "Redis"
	if c.redisCluster {
		service = "Redis Cluster"
	} else if isClusterNode(ctx, client) {
		// A node of a Cluster holds a part of the records only.
		return fail(usagef("the Redis at %s is a node of a Redis Cluster: add -redis-cluster", target.Display))
	}
	cfg := redisstore.Config{
		Prefix:               c.prefix(),
		CompactKeys:          c.compactKeys,
		DigestKeysLongerThan: c.digestKeysLongerThan,
		SkipServerCheck:      true,
		Batch:                redisstore.BatchConfig{Disabled: true},
	}
	s, err := redisstore.New(client, cfg)
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
		where: fmt.Sprintf("%s %s, prefix %q", service, target.Display, prefix),
		close: func(ctx context.Context) error {
			return errors.Join(s.Close(ctx), client.Close())
		},
	}, nil
}

func openSQL(ctx context.Context, c *config) (*admin, error) {
	var (
		db      *sql.DB
		addr    string
		service string
		dialect sqlstore.Dialect
		err     error
	)
	switch c.store {
	case storePostgres:
		service, dialect = "PostgreSQL", sqlstore.Postgres
		db, addr, err = connect.DB(ctx, dialect, c.postgresDSN)
	case storeMySQL:
		service, dialect = "MySQL/MariaDB", sqlstore.MySQL
		db, addr, err = connect.DB(ctx, dialect, c.mysqlDSN)
	default:
		service, dialect = "SQLite", sqlstore.SQLite
		db, addr, err = openSQLite(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*admin, error) {
		_ = db.Close()
		return nil, err
	}
	cfg := sqlstore.Config{
		Dialect:    dialect,
		Table:      c.tableName(),
		PurgeGrace: c.purgeGrace,
		Batch:      sqlstore.BatchConfig{Disabled: true},
	}
	st, err := sqlstore.New(db, cfg)
	if err != nil {
		return fail(usagef("-table: %v", err))
	}
	// A table name that passed sqlstore's check needs no quoting.
	tctx, cancel := context.WithTimeout(ctx, storeopen.DialTimeout)
	defer cancel()
	if _, err := db.ExecContext(tctx, "SELECT 1 FROM "+st.Table()+" WHERE 1 = 0"); err != nil {
		return fail(fmt.Errorf("cannot read the table %s on %s %s (does it exist? change -table or -run-id): %w", st.Table(), service, addr, err))
	}
	if st, err = partitioned(tctx, db, st, cfg); err != nil {
		return fail(err)
	}
	return &admin{
		Admin: st,
		where: fmt.Sprintf("%s %s, table %s", service, addr, st.Table()),
		close: func(ctx context.Context) error {
			return errors.Join(st.Close(ctx), db.Close())
		},
	}, nil
}

// openSQLite opens the SQLite file -sqlite-file or -dir names, which must
// exist: opening a file that does not would create it.
func openSQLite(ctx context.Context, c *config) (*sql.DB, string, error) {
	const setting = "-sqlite-file or -dir"
	path := c.sqliteFile
	if path == "" {
		path = filepath.Join(c.dir, sqliteFile)
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("no SQLite database at %s (change -sqlite-file or -dir)", path)
		}
		return nil, "", fmt.Errorf("SQLite database %s: %w", path, err)
	}
	db, err := storeopen.OpenDB(ctx, "sqlite", sqlstore.SQLiteDSN(path), connect.MaxConns, storeopen.DialTimeout)
	if err != nil {
		return nil, "", &storeopen.UnreachableError{Service: "SQLite", Addr: path, Setting: setting, Err: err}
	}
	return db, path, nil
}
