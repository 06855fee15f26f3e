package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// backend is one database the tests run against.
type backend struct {
	dialect sqlstore.Dialect
	// open returns a database for t: shared by the package's tests for
	// the servers (few connections on a shared server), a fresh file in
	// t.TempDir() for SQLite.
	open func(t testing.TB) *sql.DB
}

func init() {
	// The connection-cut test breaks connections on purpose; keep the
	// driver's own log quiet.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}

var backends = []backend{
	{sqlstore.Postgres, openPostgres},
	{sqlstore.MySQL, openMySQL},
	{sqlstore.SQLite, openSQLite},
}

// serverBackends are the backends behind a network connection.
var serverBackends = backends[:2]

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*sql.DB{}
)

func sharedDB(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if db, ok := sharedDBs[dsn]; ok {
		return db
	}
	db := openPool(t, driver, dsn, driver, dsn)
	sharedDBs[dsn] = db
	return db
}

// openPool opens driver's dsn with the pool of the shared test
// databases and pings it; a database that does not answer is service at
// addr unavailable (testkit.Unavailable).
func openPool(t testing.TB, driver, dsn, service, addr string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	// The servers are shared with other developers' tests: stay well
	// below max_connections.
	db.SetMaxOpenConns(24)
	db.SetMaxIdleConns(24)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		testkit.Unavailable(t, service, addr, err)
	}
	return db
}

func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return sharedDB(t, "pgx", testkit.RequirePostgres(t))
}

func openMySQL(t testing.TB) *sql.DB {
	t.Helper()
	return sharedDB(t, "mysql", testkit.RequireMySQL(t))
}

func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "dedup.db")))
	if err != nil {
		t.Fatal(err)
	}
	// One writer at a time: more connections only busy-wait for the lock
	// (see README.md).
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newStore creates a store over db on a table of its own, which
// t.Cleanup drops.
func newStore(t testing.TB, db *sql.DB, d sqlstore.Dialect, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	cfg.Dialect = d
	if cfg.Table == "" {
		cfg.Table = "dedup_test_" + storetest.NewID()
	}
	s, err := sqlstore.New(db, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx := context.Background()
	if err := s.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close(ctx)
		dropTable(t, db, d, cfg.Table)
	})
	return s
}

func dropTable(t testing.TB, db *sql.DB, d sqlstore.Dialect, table string) {
	t.Helper()
	q := `"` + table + `"`
	if d == sqlstore.MySQL {
		q = "`" + table + "`"
	}
	if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+q); err != nil {
		t.Errorf("dropping %s: %v", table, err)
	}
}

func countRows(t testing.TB, db *sql.DB, d sqlstore.Dialect, table string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf(`SELECT COUNT(*) FROM "%s"`, table)
	if d == sqlstore.MySQL {
		q = fmt.Sprintf("SELECT COUNT(*) FROM `%s`", table)
	}
	if err := db.QueryRowContext(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func forEachBackend(t *testing.T, bs []backend, fn func(t *testing.T, b backend)) {
	for _, b := range bs {
		t.Run(string(b.dialect), func(t *testing.T) { fn(t, b) })
	}
}

// bounded runs f(0) … f(n-1), each in a goroutine of its own, at most
// limit at once, and returns when they all have.
func bounded(n, limit int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, limit)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// mustBegin begins key's inbox transaction in scope on s, with
// retention, and fails t now on an error.
func mustBegin(t testing.TB, s stores.Inbox, scope, key string, retention time.Duration) stores.InboxTx {
	t.Helper()
	tx, err := s.Begin(context.Background(), scope, []string{key}, retention)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// completed claims key in scope on s for lease and completes it with
// retention, failing t now on an error.
func completed(t testing.TB, s stores.Store, scope, key string, lease, retention time.Duration) {
	t.Helper()
	c, err := s.Claim(context.Background(), scope, []string{key}, lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), c, retention, nil); err != nil {
		t.Fatal(err)
	}
}
