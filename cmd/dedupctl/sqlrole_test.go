package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestSQLRole runs every command as a role (PostgreSQL) or user (MariaDB)
// that may only SELECT, INSERT, UPDATE and DELETE on the table, which the
// test's own connection, the migration role, created: dedupctl needs no
// other privilege, and shows no password.
func TestSQLRole(t *testing.T) {
	for _, tc := range []struct {
		kind anystore.StoreKind
		flag string
		dsn  func(testing.TB) string
	}{
		{anystore.StorePostgres, "-postgres-dsn", testkit.RequirePostgres},
		{anystore.StoreMySQL, "-mysql-dsn", testkit.RequireMySQL},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			dsn := tc.dsn(t)
			o, closeStore, err := anystore.OpenStore(context.Background(), anystore.StoreParams{Kind: tc.kind, CreateSchema: true, Teardown: true})
			if err != nil {
				t.Fatal(err)
			}
			role := sqltest.NewSQLRole(t, o.Dialect, dsn) // dropped after the table
			t.Cleanup(func() { _ = closeStore(context.Background()) })
			role.Grant(t, sqltest.StoreGrants, o.Name)

			ctx := t.Context()
			for _, k := range []string{"done-1", "held-1", "gone-1"} {
				c, err := o.Store.Claim(ctx, "loyalty", []string{k}, time.Hour)
				if err != nil || c.Result != stores.Claimed {
					t.Fatalf("Claim(%q) = %+v, %v", k, c, err)
				}
				retention := time.Hour
				if k == "gone-1" {
					retention = time.Millisecond // expired by the purge below
				}
				if k != "held-1" {
					if err := o.Store.Complete(ctx, c, retention, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			password := role.DSN[strings.Index(role.DSN, "pw-"):]
			password = password[:len("pw-")+10]
			run := func(args ...string) result {
				t.Helper()
				r := dedupctl(t, append([]string{tc.flag + "=" + role.DSN, "-table=" + o.Name}, args...)...)
				if strings.Contains(r.stdout+r.stderr, password) || strings.Contains(r.stdout+r.stderr, role.Name+":") {
					t.Fatalf("the output shows the role's password: %s", r)
				}
				return r
			}
			run("stats").want(t, exitOK, "stdout:"+o.Name)
			run("stats", "-json").want(t, exitOK, `stdout:"store"`)
			run("list").want(t, exitOK)
			run("get", "loyalty", "done-1").want(t, exitOK, "stdout:done")
			run("forget", "loyalty", "done-1", "-yes").want(t, exitOK)
			run("release", "loyalty", "held-1", "-yes").want(t, exitOK)
			run("purge", "-purge-grace=1ms").want(t, exitOK, "stdout:purged 1 expired record")
			run("stats", "-json").want(t, exitOK, `stdout:"total": 0`)

			// A table the role was not granted: refused, and said so.
			run("-table=dedup_nope", "stats").want(t, exitError, "stderr:cannot read the table dedup_nope")
		})
	}
}

// TestSQLRolePartitioned: on PostgreSQL's daily partitions, dedupctl
// reads and writes records as a role that may only read and write the
// table; its purge drops and creates partitions as the layout's purge
// job does (not the rows a plain purge would look for, of which the
// parent table holds none), which needs the table's owner: as the role it
// fails and says so, as the owner it runs.
func TestSQLRolePartitioned(t *testing.T) {
	dsn := testkit.RequirePostgres(t)
	o, closeStore, err := anystore.OpenStore(context.Background(), anystore.StoreParams{
		Kind: anystore.StorePostgres, CreateSchema: true, Teardown: true,
		// Fewer days ahead than dedupctl's default: its purge has
		// partitions to create.
		SQL: sqlstore.Config{DailyPartitions: true, PurgeInterval: time.Hour, PartitionDaysAhead: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	role := sqltest.NewSQLRole(t, o.Dialect, dsn)
	t.Cleanup(func() { _ = closeStore(context.Background()) })
	role.Grant(t, sqltest.StoreGrants, o.Name)
	c, err := o.Store.Claim(t.Context(), "loyalty", []string{"done-1"}, time.Hour)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if err := o.Store.Complete(t.Context(), c, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	asRole := []string{"-postgres-dsn=" + role.DSN, "-table=" + o.Name}
	dedupctl(t, append(asRole, "get", "loyalty", "done-1")...).want(t, exitOK, "stdout:done")
	dedupctl(t, append(asRole, "stats")...).want(t, exitOK, "stdout:"+o.Name)
	dedupctl(t, append(asRole, "purge")...).want(t, exitError, "stderr:needs a role that owns the table", "stderr:SQLSTATE 42501")
	dedupctl(t, "-postgres-dsn="+dsn, "-table="+o.Name, "purge").want(t, exitOK, "stdout:purged")
	dedupctl(t, append(asRole, "purge")...).want(t, exitOK, "stdout:purged 0")
	dedupctl(t, append(asRole, "forget", "loyalty", "done-1", "-yes")...).want(t, exitOK)
	dedupctl(t, append(asRole, "get", "loyalty", "done-1")...).want(t, exitNotFound)
}
