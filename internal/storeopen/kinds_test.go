package storeopen_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// The kinds keep the names, order and flags the programs had.
func TestKinds(t *testing.T) {
	if got, want := storeopen.Names(nil), []string{"memory", "redis", "postgres", "mysql", "sqlite", "nats"}; !slices.Equal(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
	for _, k := range storeopen.Kinds() {
		if l, ok := storeopen.Lookup(k.Name); !ok || l != k {
			t.Errorf("Lookup(%q) = %v, %v", k.Name, l, ok)
		}
		if k.InProcess() != (k.Name == "memory") {
			t.Errorf("%s: InProcess %v", k.Name, k.InProcess())
		}
	}
	if _, ok := storeopen.Lookup("oracle"); ok {
		t.Error("Lookup found an unknown kind")
	}
	for flagName, want := range map[string]string{
		"redis-addr": "redis", "redis-cluster": "redis", "redis-ca": "redis", "redis-prefix": "redis", "compact-keys": "redis",
		"digest-keys-longer-than": "redis", "postgres-dsn": "postgres", "mysql-dsn": "mysql", "dir": "sqlite", "sqlite-file": "sqlite",
		"nats-url": "nats", "nats-bucket": "nats", "nats-shards": "nats", "nats-creds": "nats", "nats-key": "nats",
		"table": "", "purge-grace": "", "timeout": "",
	} {
		if got := storeopen.FlagKind(flagName); got != want {
			t.Errorf("FlagKind(%q) = %q, want %q", flagName, got, want)
		}
	}
	flags := storeopen.Flags()
	if len(flags) != 25 || !slices.Contains(flags, "table") || !slices.Contains(flags, "nats-password") {
		t.Errorf("Flags = %v", flags)
	}
	var s storeopen.Settings
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	s.RegisterFlags(fs)
	if s.Redis.Addr != storeopen.DefaultRedisAddr || s.PostgresDSN != storeopen.DefaultPostgresDSN || s.MySQLDSN != storeopen.DefaultMySQLDSN ||
		s.NATS.URL != storeopen.DefaultNATSURL || s.NATS.Bucket != "" {
		t.Errorf("the flags' defaults: %+v", s)
	}
	for kind, want := range map[string]string{"redis": "router_example:r1:", "postgres": "router_example_r1", "sqlite": "router_example_r1", "nats": "router_example_r1", "memory": ""} {
		if k, _ := storeopen.Lookup(kind); k.RunName("r1") != want {
			t.Errorf("%s: RunName = %q, want %q", kind, k.RunName("r1"), want)
		}
	}
}

func TestOpenMemory(t *testing.T) {
	ctx := context.Background()
	o, err := storeopen.Opener{}.Open(ctx, "memory", storeopen.Request{Config: memstore.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "in-process" || o.Kind.Name != "memory" {
		t.Errorf("opened %+v", o)
	}
	if _, err := o.Admin(); err != nil {
		t.Error(err)
	}
	if err := o.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Store.Claim(ctx, "s", []string{"k"}, 1); !errors.Is(err, stores.ErrClosed) {
		t.Errorf("a Claim after Close: %v, want ErrClosed", err)
	}
	if _, err := (storeopen.Opener{}).Open(ctx, "memory", storeopen.Request{Config: redisstore.Config{}}); err == nil {
		t.Error("the memory store took a redisstore.Config")
	}
	if _, err := (storeopen.Opener{}).Open(ctx, "oracle", storeopen.Request{}); err == nil || !strings.Contains(err.Error(), "memory, redis, postgres") {
		t.Errorf("an unknown kind: %v", err)
	}
}

// A SQLite store without a file is in a temporary directory Close
// removes; Remove drops its table; an administrator's must exist.
func TestOpenSQLite(t *testing.T) {
	ctx := context.Background()
	o, err := storeopen.Opener{TempDir: "storeopen-test-"}.Open(ctx, "sqlite", storeopen.Request{Name: "t1", CreateSchema: true})
	if err != nil {
		t.Fatal(err)
	}
	if o.TempDir == "" || !strings.HasPrefix(filepath.Base(o.TempDir), "storeopen-test-") || o.Path != filepath.Join(o.TempDir, storeopen.SQLiteFile) {
		t.Errorf("temporary directory %q, file %q", o.TempDir, o.Path)
	}
	if o.Name != "t1" || o.Records != "table t1" || o.Removal != "drop table t1" {
		t.Errorf("name %q, records %q, removal %q", o.Name, o.Records, o.Removal)
	}
	if err := o.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := o.DB.ExecContext(ctx, "SELECT 1 FROM t1"); err == nil {
		t.Error("the table is still there after Remove")
	}
	if err := o.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.TempDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary directory after Close: %v", err)
	}

	dir := t.TempDir()
	var s storeopen.Settings
	s.SQLite.Dir = dir
	for _, tc := range []struct {
		s    storeopen.Settings
		want string
	}{
		{storeopen.Settings{}, "-store=sqlite needs the database file"},
		{s, "no SQLite database at " + filepath.Join(dir, storeopen.SQLiteFile) + " (change -sqlite-file or -dir)"},
	} {
		if _, err := (storeopen.Opener{}).Open(ctx, "sqlite", storeopen.Request{Settings: tc.s, Admin: true}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("an administrator's SQLite with %+v: %v, want %q", tc.s.SQLite, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("an administrator's open created %v", entries)
	}
}

// A program names the settings its own way.
func TestSettingNames(t *testing.T) {
	var s storeopen.Settings
	s.PostgresDSN = "postgres://u@h:5432/db?%zz"
	_, err := storeopen.Opener{SettingNames: map[string]string{storeopen.PostgresSetting: "POSTGRES_DSN"}}.Open(context.Background(), "postgres", storeopen.Request{Settings: s})
	var se *storeopen.SettingError
	if !errors.As(err, &se) || se.Setting != "POSTGRES_DSN" {
		t.Errorf("a bad DSN: %v, want a *SettingError naming POSTGRES_DSN", err)
	}
}
