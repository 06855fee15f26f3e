package storeopen

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/watermill-dedup/dedup/internal/sqlpool"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// The SQL kinds: sqlstore on PostgreSQL, MySQL/MariaDB and a SQLite file.
var (
	postgresKind = &Kind{
		Name:    "postgres",
		Service: "PostgreSQL",
		Dialect: sqlstore.Postgres,
		flags: func(fs *flag.FlagSet, s *Settings) {
			fs.StringVar(&s.PostgresDSN, "postgres-dsn", firstOf(s.PostgresDSN, DefaultPostgresDSN), "PostgreSQL `DSN`")
		},
		runName: sqlRunName,
		open:    openSQLStore,
	}
	mysqlKind = &Kind{
		Name:    "mysql",
		Service: "MySQL/MariaDB",
		Dialect: sqlstore.MySQL,
		flags: func(fs *flag.FlagSet, s *Settings) {
			fs.StringVar(&s.MySQLDSN, "mysql-dsn", firstOf(s.MySQLDSN, DefaultMySQLDSN), "MySQL/MariaDB `DSN` in go-sql-driver form")
		},
		runName: sqlRunName,
		open:    openSQLStore,
	}
	sqliteKind = &Kind{
		Name:    "sqlite",
		Service: "SQLite",
		Dialect: sqlstore.SQLite,
		flags: func(fs *flag.FlagSet, s *Settings) {
			fs.StringVar(&s.SQLite.Dir, "dir", s.SQLite.Dir, "`directory` of router_example's SQLite file, "+SQLiteFile)
			fs.StringVar(&s.SQLite.File, "sqlite-file", s.SQLite.File, "SQLite database `file` (instead of -dir)")
		},
		check: func(s *Settings) error {
			if s.SQLite.path() == "" {
				return fmt.Errorf("-store=sqlite needs the database file: -sqlite-file, or -dir (router_example's directory, holding %s)", SQLiteFile)
			}
			return nil
		},
		runName: sqlRunName,
		open:    openSQLStore,
	}
)

// sqlRunName is the table of router_example's run runID.
func sqlRunName(runID string) string { return "router_example_" + runID }

// SQLiteSettings are where the SQLite file is: File, else SQLiteFile in
// Dir, else (but with Request.Admin) a new file in a temporary directory
// that Close removes.
type SQLiteSettings struct {
	File string // -sqlite-file
	Dir  string // -dir: router_example's directory
}

func (s SQLiteSettings) path() string {
	switch {
	case s.File != "":
		return s.File
	case s.Dir != "":
		return filepath.Join(s.Dir, SQLiteFile)
	}
	return ""
}

func openSQLStore(ctx context.Context, o Opener, r Request, out *Opened) error {
	d := out.Kind.Dialect
	cfg, err := configOf[sqlstore.Config](out.Kind, r)
	if err != nil {
		return err
	}
	cfg.Dialect = d
	name := r.name(out.Kind, r.Settings.Table)
	if name != "" {
		cfg.Table = name
	}
	if cfg.Logger == nil {
		cfg.Logger = r.Logger
	}
	if r.Admin {
		cfg.PurgeGrace = r.Settings.PurgeGrace
		cfg.Batch = sqlstore.BatchConfig{Disabled: true}
	}
	var db *sql.DB
	switch d {
	case sqlstore.Postgres:
		db, out.Addr, err = o.DB(ctx, d, r.Settings.PostgresDSN)
	case sqlstore.MySQL:
		db, out.Addr, err = o.DB(ctx, d, r.Settings.MySQLDSN)
	default:
		db, err = o.openSQLite(ctx, r, out)
	}
	if err != nil {
		return err
	}
	out.DB = db
	out.onClose(func(context.Context) error { return db.Close() })
	st, err := sqlstore.New(db, cfg)
	if err != nil {
		if r.Admin {
			return &SettingError{Setting: "-table", Err: err}
		}
		return err
	}
	out.setStore(st)
	out.Name, out.Records = st.Table(), "table "+st.Table()
	if name != "" {
		// Set before the table is created: Close with RemoveOnClose drops
		// it even when its creation failed part-way.
		out.remove = func(ctx context.Context) error {
			// A table name that passed sqlstore's check needs no quoting.
			_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+st.Table())
			return err
		}
		out.Removal = "drop table " + st.Table()
	}
	if r.CreateSchema {
		if err := st.CreateSchema(ctx); err != nil {
			return fmt.Errorf("create the dedup table %s on %s: %w", st.Table(), out.Addr, err)
		}
	}
	if r.Admin {
		tctx, cancel := context.WithTimeout(ctx, DialTimeout)
		defer cancel()
		// A table name that passed sqlstore's check needs no quoting.
		if _, err := db.ExecContext(tctx, "SELECT 1 FROM "+st.Table()+" WHERE 1 = 0"); err != nil {
			return fmt.Errorf("cannot read the table %s on %s %s (does it exist? change -table or -run-id): %w", st.Table(), out.Service, out.Addr, err)
		}
		return partitioned(tctx, db, st, cfg, out)
	}
	return nil
}

// openSQLite opens the SQLite file of r's settings: with Request.Admin,
// one that exists (opening a file that does not would create it);
// otherwise in a directory it creates if need be, or a temporary one.
func (o Opener) openSQLite(ctx context.Context, r Request, out *Opened) (*sql.DB, error) {
	path := r.Settings.SQLite.path()
	switch {
	case r.Admin:
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("no SQLite database at %s (change -sqlite-file or -dir)", path)
			}
			return nil, fmt.Errorf("SQLite database %s: %w", path, err)
		}
	case path == "":
		tmp, err := os.MkdirTemp("", firstOf(o.TempDir, "dedup-sqlite-"))
		if err != nil {
			return nil, fmt.Errorf("create a temporary directory for SQLite (or set -dir): %w", err)
		}
		out.TempDir = tmp
		out.onClose(func(context.Context) error { return os.RemoveAll(tmp) })
		path = filepath.Join(tmp, SQLiteFile)
	default:
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, &SettingError{Setting: SQLiteSetting, Err: err}
		}
	}
	conns := o.SQLiteConns
	if conns <= 0 {
		conns = 1
	}
	db, err := sqlpool.Open(ctx, "sqlite", sqlstore.SQLiteDSN(path), conns, o.pingTimeout())
	if err != nil {
		return nil, &UnreachableError{Service: "SQLite", Addr: path, Setting: SQLiteSetting, Err: err}
	}
	out.Path, out.Addr = path, path
	return db, nil
}

// partitioned keeps st, or, when its table is a PostgreSQL partitioned
// table (sqlstore's DailyPartitions layout), puts a store of cfg on that
// layout in its place: there a purge drops the partitions whose records
// all expired (and creates those missing ahead, as the consumers' purge
// job does; both need the table's owner), where the plain layout's purge
// would find no row to delete, and deletes take the layout's locks. It
// runs no purge job of its own (PurgeJobElsewhere).
func partitioned(ctx context.Context, db *sql.DB, st *sqlstore.Store, cfg sqlstore.Config, out *Opened) error {
	if st.Dialect() != sqlstore.Postgres {
		return nil
	}
	var yes bool
	// A table name that passed sqlstore's check needs no quoting.
	if err := db.QueryRowContext(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass", st.Table()).Scan(&yes); err != nil {
		return fmt.Errorf("reading the layout of the table %s: %w", st.Table(), err)
	}
	if !yes {
		return nil
	}
	cfg.DailyPartitions, cfg.PurgeJobElsewhere = true, true
	p, err := sqlstore.New(db, cfg)
	if err != nil {
		return err
	}
	_ = st.Close(ctx)
	out.setStore(p)
	return nil
}
