package sqltest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Backend is one database the tests run against.
type Backend struct {
	Dialect sqlstore.Dialect
	// Open returns a database for t: shared by the package's tests for
	// the servers (few connections on a shared server), a fresh file in
	// t.TempDir() for SQLite.
	Open func(t testing.TB) *sql.DB
}

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*sql.DB{}
)

// SharedDB is the pool on driver's dsn the tests share, opened by the
// first (see OpenPool).
func SharedDB(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if db, ok := sharedDBs[dsn]; ok {
		return db
	}
	db := OpenPool(t, driver, dsn, driver, dsn)
	sharedDBs[dsn] = db
	return db
}

// OpenPool opens driver's dsn with the pool of the shared test
// databases and pings it; a database that does not answer is service at
// addr unavailable (testkit.Unavailable).
func OpenPool(t testing.TB, driver, dsn, service, addr string) *sql.DB {
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

// OpenPostgres is the shared pool on the test PostgreSQL database.
func OpenPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return SharedDB(t, "pgx", testkit.RequirePostgres(t))
}

// OpenMySQL is the shared pool on the test MySQL/MariaDB database.
func OpenMySQL(t testing.TB) *sql.DB {
	t.Helper()
	return SharedDB(t, "mysql", testkit.RequireMySQL(t))
}

// NewStore creates a store over db on a table of its own, which
// t.Cleanup drops.
func NewStore(t testing.TB, db *sql.DB, d sqlstore.Dialect, cfg sqlstore.Config) *sqlstore.Store {
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
		DropTable(t, db, d, cfg.Table)
	})
	return s
}

// DropTable drops table from db, if it exists (quoted as dialect d
// quotes it).
func DropTable(t testing.TB, db *sql.DB, d sqlstore.Dialect, table string) {
	t.Helper()
	q := `"` + table + `"`
	if d == sqlstore.MySQL {
		q = "`" + table + "`"
	}
	if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+q); err != nil {
		t.Errorf("dropping %s: %v", table, err)
	}
}

// CountRows is the number of rows in table.
func CountRows(t testing.TB, db *sql.DB, d sqlstore.Dialect, table string) int {
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

// ForEachBackend runs fn on each of bs, as a subtest named by its dialect.
func ForEachBackend(t *testing.T, bs []Backend, fn func(t *testing.T, b Backend)) {
	for _, b := range bs {
		t.Run(string(b.Dialect), func(t *testing.T) { fn(t, b) })
	}
}

// Bounded runs f(0) … f(n-1), each in a goroutine of its own, at most
// limit at once, and returns when they all have.
func Bounded(n, limit int, f func(i int)) {
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

// MustBegin begins key's inbox transaction in scope on s, with
// retention, and fails t now on an error.
func MustBegin(t testing.TB, s stores.Inbox, scope, key string, retention time.Duration) stores.InboxTx {
	t.Helper()
	tx, err := s.Begin(context.Background(), scope, []string{key}, retention)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// Completed claims key in scope on s for lease and completes it with
// retention, failing t now on an error.
func Completed(t testing.TB, s stores.Store, scope, key string, lease, retention time.Duration) {
	t.Helper()
	c, err := s.Claim(context.Background(), scope, []string{key}, lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), c, retention, nil); err != nil {
		t.Fatal(err)
	}
}

// An error is an outage only when it is known to be one: a server that
// refuses the client (its credentials, its TLS, its privileges) is not
// unavailable, whatever the driver makes of the refusal (a connect error,
// a TLS alert that crypto/tls returns as a network error, a connection
// the driver reports invalid), and neither is a reset or an EOF from a
// server whose last word to the store was such a refusal. FailOpen would
// run handlers through an outage, unprotected, for as long as the
// settings stay wrong.

// StoreOnDB is a store over db on an existing table, closed with the
// test.
func StoreOnDB(t *testing.T, db *sql.DB, d sqlstore.Dialect, table string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, sqlstore.Config{Dialect: d, Table: table, Batch: sqlstore.BatchConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// OpenDB opens driver's dsn, closed with the test.
func OpenDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// forEachBatching runs fn on every dialect with group commit on (the
// default, "batched") and off ("unbatched").
func forEachBatching(t *testing.T, bs []Backend, fn func(t *testing.T, b Backend, off bool)) {
	ForEachBackend(t, bs, func(t *testing.T, b Backend) {
		for _, off := range []bool{false, true} {
			name := "batched"
			if off {
				name = "unbatched"
			}
			t.Run(name, func(t *testing.T) { fn(t, b, off) })
		}
	})
}

// MaxDataRoundTrip claims key, completes it with n bytes of data and
// checks they are read back whole.
func MaxDataRoundTrip(t *testing.T, s *sqlstore.Store, key string, n int) {
	t.Helper()
	ctx := context.Background()
	data := bytes.Repeat([]byte{0xa5, 0, 0xff, 'x'}, n/4+1)[:n]
	c, err := s.Claim(ctx, "s", []string{key}, time.Hour)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim = %v, %v", c, err)
	}
	if err := s.Complete(ctx, c, time.Hour, data); err != nil {
		t.Fatalf("Complete with %d bytes of data: %v", n, err)
	}
	d, err := s.Claim(ctx, "s", []string{key}, time.Hour)
	if err != nil || d.Result != stores.Duplicate || !bytes.Equal(d.Data, data) {
		t.Fatalf("Claim after Complete = %v with %d bytes, %v; want duplicate with %d", d.Result, len(d.Data), err, n)
	}
}
