package sqltest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/internal/sqlpool"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// StoreGrants are the privileges the SQL store's role needs on its table,
// and all it needs (stores/sqlstore/README.md, "Least privilege").
const StoreGrants = "SELECT, INSERT, UPDATE, DELETE"

// SQLRole is a PostgreSQL role or a MySQL/MariaDB user that a test made,
// with a name of its own and no privilege but those Grant gives: the
// least-privileged role a store runs as, beside the migration role (the
// test's own connection) that creates the tables. It is dropped when the
// test ends, after the tables the test drops and the pools Open opened.
type SQLRole struct {
	Name    string
	DSN     string // the role's: the test database's DSN with its user and password
	dialect sqlstore.Dialect
	admin   *sql.DB
}

// NewSQLRole makes a role (PostgreSQL: LOGIN, PASSWORD) or user
// (MySQL/MariaDB: 'name'@'%') that can log in to the database of dsn, as
// dsn's user (one that may create roles, and grant on the tables), and
// may do nothing else. It never changes the server's settings.
func NewSQLRole(t testing.TB, d sqlstore.Dialect, dsn string) *SQLRole {
	t.Helper()
	id := testkit.UniqueName("")
	r := &SQLRole{Name: "dedup_role_" + id, dialect: d}
	password := "pw-" + id
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	driver := "pgx"
	if d == sqlstore.MySQL {
		driver = "mysql"
	}
	admin, err := sqlpool.Open(ctx, driver, dsn, 2, 10*time.Second)
	if err != nil {
		testkit.Unavailable(t, string(d), "its DSN", err)
	}
	r.admin = admin
	t.Cleanup(func() { _ = admin.Close() }) // after the role is dropped
	switch d {
	case sqlstore.Postgres:
		u, err := url.Parse(dsn)
		if err != nil || u.Scheme == "" {
			t.Fatalf("the PostgreSQL DSN is not a URL: %v", err)
		}
		u.User = url.UserPassword(r.Name, password)
		r.DSN = u.String()
		r.exec(t, ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", r.Name, password))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// Its privileges on what the test left, then the role.
			r.exec(t, ctx, "DROP OWNED BY "+r.Name)
			r.exec(t, ctx, "DROP ROLE "+r.Name)
		})
	case sqlstore.MySQL:
		c, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("the MySQL DSN: %v", err)
		}
		c.User, c.Passwd = r.Name, password
		r.DSN = c.FormatDSN()
		r.exec(t, ctx, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", r.Name, password))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r.exec(t, ctx, fmt.Sprintf("DROP USER '%s'@'%%'", r.Name))
		})
	default:
		t.Fatalf("NewSQLRole: no roles on %s", d)
	}
	return r
}

func (r *SQLRole) exec(t testing.TB, ctx context.Context, stmt string) {
	t.Helper()
	if _, err := r.admin.ExecContext(ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// Grant gives the role privileges (StoreGrants, say) on table, as
// stores/sqlstore/README.md's GRANT does.
func (r *SQLRole) Grant(t testing.TB, privileges, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.exec(t, ctx, r.GrantStatement(privileges, table))
}

// GrantStatement is the GRANT of privileges on table to the role.
func (r *SQLRole) GrantStatement(privileges, table string) string {
	if r.dialect == sqlstore.MySQL {
		return fmt.Sprintf("GRANT %s ON %s TO '%s'@'%%'", privileges, quoteMySQL(table), r.Name)
	}
	return fmt.Sprintf("GRANT %s ON %s TO %s", privileges, quotePostgres(table), r.Name)
}

// Open opens a pool of conns connections as the role, closed when the
// test ends (before the role is dropped).
func (r *SQLRole) Open(t testing.TB, conns int) *sql.DB {
	t.Helper()
	driver := "pgx"
	if r.dialect == sqlstore.MySQL {
		driver = "mysql"
	}
	db, err := sqlpool.Open(context.Background(), driver, r.DSN, conns, 10*time.Second)
	if err != nil {
		t.Fatalf("connecting as %s: %v", r.Name, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func quotePostgres(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, ".")
}

func quoteMySQL(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ".")
}
