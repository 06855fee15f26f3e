package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// roleEnv is a least-privileged role beside the migration role (the
// tests' own connection, which creates the tables).
type roleEnv struct {
	t     *testing.T // the test the pools live as long as
	b     sqltest.Backend
	admin *sql.DB
	role  *sqltest.SQLRole
	db    *sql.DB // as the role, once it has a table (MariaDB lets no user without a privilege in the database connect to it)
}

func newRoleEnv(t *testing.T, b sqltest.Backend) *roleEnv {
	t.Helper()
	admin := b.Open(t)
	dsn := testkit.PostgresDSN()
	if b.Dialect == sqlstore.MySQL {
		dsn = testkit.MySQLDSN()
	}
	role := sqltest.NewSQLRole(t, b.Dialect, dsn)
	return &roleEnv{t: t, b: b, admin: admin, role: role}
}

// table creates a table of cfg's layout as the migration role (the
// README's DDL, through CreateSchema), grants the role the README's
// privileges on it, and returns its name; t.Cleanup drops it.
func (e *roleEnv) table(t *testing.T, cfg sqlstore.Config) string {
	t.Helper()
	owner := sqltest.NewStore(t, e.admin, e.b.Dialect, cfg) // drops the table when t ends
	e.grant(t, sqltest.StoreGrants, owner.Table())
	return owner.Table()
}

// grant grants the role privileges on table, and connects as the role
// once it has one.
func (e *roleEnv) grant(t *testing.T, privileges, table string) {
	t.Helper()
	e.role.Grant(t, privileges, table)
	if e.db == nil {
		e.db = e.role.Open(e.t, 24) // as the shared pools: the concurrent tests hold a connection per caller
	}
}

// store opens a store as the role on table: New, the session check at
// its first call, and every call after that, without DDL.
func (e *roleEnv) store(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	cfg.Dialect = e.b.Dialect
	s, err := sqlstore.New(e.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// inbox is the Inbox fixture of store, the role's: the handler's writes
// go to an effects table that the migration role creates and grants the
// role, in outer transactions of the role's.
func (e *roleEnv) inbox(t *testing.T, store storetest.InboxStore) storetest.InboxFixture {
	t.Helper()
	fx, effects := sqltest.NewEffectsTableNamed(t, e.admin, e.b.Dialect)
	e.grant(t, "SELECT, INSERT", effects)
	fx.Store = store
	fx.BeginOuter = func(ctx context.Context) (storetest.OuterTx, error) {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return sqltest.SQLOuter{Tx: tx}, nil
	}
	return fx
}

// TestLeastPrivilegeRole runs the store as a role that may only read and
// write its table: SELECT, INSERT, UPDATE and DELETE on it, granted by
// the migration role that created it with the README's DDL. The role
// cannot create a table (so nothing the store does needs to), and the
// conformance suite (admin calls and Purge included), the Inbox suite and
// a purge job pass as it.
func TestLeastPrivilegeRole(t *testing.T) {
	sqltest.ForEachBackend(t, backends, func(t *testing.T, b sqltest.Backend) {
		e := newRoleEnv(t, b)
		ctx := context.Background()

		t.Run("no DDL", func(t *testing.T) {
			e.table(t, sqlstore.Config{Table: "dedup_role_" + storetest.NewID()})
			s := e.store(t, sqlstore.Config{Table: "dedup_nope_" + storetest.NewID()})
			if err := s.CreateSchema(ctx); err == nil {
				sqltest.DropTable(t, e.admin, b.Dialect, s.Table())
				t.Fatal("the role could create a table: it has more privileges than the test means")
			}
		})

		t.Run("conformance", func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
				cfg := sqlstore.Config{Table: "dedup_role_" + storetest.NewID(), Clock: clock}
				e.table(t, cfg)
				return e.store(t, cfg)
			}, storetest.AdminNoScopes())
		})

		t.Run("inbox", func(t *testing.T) {
			storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
				cfg := sqlstore.Config{Table: "dedup_role_" + storetest.NewID(), Clock: clock}
				e.table(t, cfg)
				return e.inbox(t, e.store(t, cfg))
			})
		})

		t.Run("purge job", func(t *testing.T) {
			clock := storetest.NewFakeClock(time.Now())
			cfg := sqlstore.Config{Table: "dedup_role_" + storetest.NewID(), Clock: clock}
			e.table(t, cfg)
			s := e.store(t, cfg)
			sqltest.Completed(t, s, "s", "k", time.Minute, time.Minute)
			clock.Advance(time.Hour)
			log := newPurgeLog()
			cfg.PurgeInterval, cfg.Logger = time.Millisecond, log
			e.store(t, cfg) // its job purges as the role
			if err := log.wait(); err != nil {
				t.Fatal(err)
			}
			if n := sqltest.CountRows(t, e.admin, b.Dialect, cfg.Table); n != 0 {
				t.Fatalf("%d rows after the purge job deleted the expired record", n)
			}
		})
	})
}

// TestLeastPrivilegePartitions: on the partitioned layout (PostgreSQL),
// the consumers' stores run as a role that may only read and write the
// table, with PurgeJobElsewhere; the purge job, which creates and drops
// partitions, runs as the table's owner. The conformance and Inbox suites
// pass so, their Purge done by the owner's job; the role's own Purge,
// when it would have to create a partition, fails and says how to set it
// up.
func TestLeastPrivilegePartitions(t *testing.T) {
	e := newRoleEnv(t, backends[0])
	partitioned := func(clock stores.Clock) sqlstore.Config {
		return sqlstore.Config{Table: "dedup_role_" + storetest.NewID(), Clock: clock, DailyPartitions: true, PurgeJobElsewhere: true}
	}
	// owned is the owner's store, with the purge job, on cfg's table.
	owned := func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
		cfg.PurgeJobElsewhere, cfg.PurgeInterval = false, time.Hour
		owner := sqltest.NewStore(t, e.admin, sqlstore.Postgres, cfg)
		e.grant(t, sqltest.StoreGrants, owner.Table())
		return owner
	}

	t.Run("conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
			cfg := partitioned(clock)
			owner := owned(t, cfg) // before the role's store: it grants
			return purgedBy{e.store(t, cfg), owner}
		}, storetest.AdminNoScopes())
	})
	t.Run("inbox", func(t *testing.T) {
		storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
			cfg := partitioned(clock)
			owner := owned(t, cfg) // before the role's store: it grants
			return e.inbox(t, purgedBy{e.store(t, cfg), owner})
		})
	})
	t.Run("the role's own purge", func(t *testing.T) {
		ctx := context.Background()
		clock := storetest.NewFakeClock(time.Now())
		cfg := partitioned(clock)
		owner := owned(t, cfg)
		s := e.store(t, cfg)
		if _, err := s.Purge(ctx); err != nil {
			t.Fatalf("the role's Purge with every partition there, nothing to drop: %v", err)
		}
		clock.Advance(3 * 24 * time.Hour) // a partition to create, and some to drop
		_, err := s.Purge(ctx)
		if err == nil || !strings.Contains(err.Error(), "needs a role that owns the table") || !strings.Contains(err.Error(), "PurgeJobElsewhere") {
			t.Fatalf("the role's Purge: %v, want a refusal that says the job needs the owner", err)
		}
		if _, err := owner.Purge(ctx); err != nil {
			t.Fatalf("the owner's Purge: %v", err)
		}
		if _, err := s.Purge(ctx); err != nil {
			t.Fatalf("the role's Purge once the owner's job ran: %v", err)
		}
	})
}

// purgedBy is a store whose Purge is another's: the consumers' store, as
// a role that may only read and write the table, and the purge job's, as
// its owner.
type purgedBy struct {
	*sqlstore.Store
	job *sqlstore.Store
}

func (p purgedBy) Purge(ctx context.Context) (int64, error) { return p.job.Purge(ctx) }

// Close closes both.
func (p purgedBy) Close(ctx context.Context) error {
	return errors.Join(p.Store.Close(ctx), p.job.Close(ctx))
}

// TestREADMEGrants keeps README.md's GRANT statements the ones the tests
// run as.
func TestREADMEGrants(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`GRANT ` + sqltest.StoreGrants + ` ON "dedup_inbox" TO dedup_app;`,
		"GRANT " + sqltest.StoreGrants + " ON `dedup_inbox` TO 'dedup_app'@'%';",
	} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md lacks %s", want)
		}
	}
}

// purgeLog is a logger that tells when the purge job deleted records,
// or failed.
type purgeLog struct {
	watermill.LoggerAdapter
	purged chan struct{}
	failed chan error
}

func newPurgeLog() *purgeLog {
	return &purgeLog{LoggerAdapter: watermill.NopLogger{}, purged: make(chan struct{}, 1), failed: make(chan error, 1)}
}

func (l *purgeLog) Debug(msg string, _ watermill.LogFields) {
	if strings.Contains(msg, "purged expired records") {
		select {
		case l.purged <- struct{}{}:
		default:
		}
	}
}

func (l *purgeLog) Error(msg string, err error, _ watermill.LogFields) {
	select {
	case l.failed <- fmt.Errorf("%s: %w", msg, err):
	default:
	}
}

// wait waits for the job's first purge that deleted records, or its
// first failure; a minute without either is a job that does not run.
func (l *purgeLog) wait() error {
	select {
	case <-l.purged:
		return nil
	case err := <-l.failed:
		return err
	case <-time.After(time.Minute):
		return errors.New("the purge job neither purged nor failed in a minute")
	}
}
