package anystore_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

func TestOpenStore(t *testing.T) {
	for _, kind := range anystore.StoreKinds() {
		if kind == anystore.StoreRedisCluster {
			continue // no default service: TestOpenStoreUnreachable
		}
		t.Run(string(kind), func(t *testing.T) {
			anystore.RequireStore(t, kind)
			ctx := context.Background()
			// openClaim opens a store of p and claims k1 there.
			openClaim := func(p anystore.StoreParams) (*anystore.OpenedStore, func(context.Context) error, *stores.Claim) {
				t.Helper()
				o, cleanup, err := anystore.OpenStore(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				c, err := o.Store.Claim(ctx, "scope", []string{"k1"}, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return o, cleanup, c
			}
			p := anystore.StoreParams{Kind: kind, CreateSchema: true, Teardown: true, Redis: redisstore.Config{SkipServerCheck: true}}
			o, cleanup, c := openClaim(p)
			if err := o.Store.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}

			// A second store on the same name shares the records.
			p.Name, p.Teardown, p.CreateSchema = o.Name, false, false
			if kind != anystore.StoreMemory && kind != anystore.StoreSQLite {
				_, cleanup2, c2 := openClaim(p)
				if c2.Result != stores.Duplicate {
					t.Errorf("second store on %s: claim result %v, want duplicate", o.Name, c2.Result)
				}
				if err := cleanup2(ctx); err != nil {
					t.Error(err)
				}
			}
			if err := cleanup(ctx); err != nil {
				t.Fatal(err)
			}

			// Teardown removed the records.
			switch {
			case o.Redis != nil:
				client := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
				defer client.Close()
				keys, err := client.Keys(ctx, o.Name+"*").Result()
				if err != nil || len(keys) > 0 {
					t.Errorf("keys left under %s: %v (%v)", o.Name, keys, err)
				}
			case o.NATS != nil:
				js := natstest.JetStream(t, testkit.NATSURL())
				if _, err := js.KeyValue(ctx, o.Name); !errors.Is(err, jetstream.ErrBucketNotFound) {
					t.Errorf("bucket %s after Teardown: %v, want it gone", o.Name, err)
				}
			case o.Path != "":
				if _, err := os.Stat(o.Path); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the SQLite file %s after the cleanup: %v, want it removed", o.Path, err)
				}
			case o.DB != nil:
				o3, cleanup3, err := anystore.OpenStore(ctx, anystore.StoreParams{Kind: kind})
				if err != nil {
					t.Fatal(err)
				}
				defer cleanup3(ctx) //nolint:errcheck
				var n int
				if err := o3.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+o.Name).Scan(&n); err == nil {
					t.Errorf("table %s still exists after Teardown", o.Name)
				}
			}
		})
	}
}

func TestOpenStoreUnreachable(t *testing.T) {
	for _, kind := range []anystore.StoreKind{anystore.StoreRedis, anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreNATS} {
		_, _, err := anystore.OpenStore(context.Background(), anystore.StoreParams{Kind: kind, Addr: "127.0.0.1:1", DialTimeout: 500 * time.Millisecond})
		var u *anystore.UnreachableError
		if !errors.As(err, &u) || u.Addr == "" || u.Service == "" {
			t.Errorf("%s on a closed port: %v, want an *UnreachableError", kind, err)
		}
	}
	if _, _, err := anystore.OpenStore(context.Background(), anystore.StoreParams{Kind: "oracle"}); err == nil {
		t.Error("an unknown kind opened")
	}
	if _, _, err := anystore.OpenStore(context.Background(), anystore.StoreParams{Kind: anystore.StoreRedisCluster}); err == nil {
		t.Error("a redis-cluster without Addr opened")
	}
}

// DropTables drops the tables it is given, quoted or not, and only those.
func TestDropTables(t *testing.T) {
	for _, kind := range []anystore.StoreKind{anystore.StorePostgres, anystore.StoreMySQL} {
		t.Run(string(kind), func(t *testing.T) {
			anystore.RequireStore(t, kind)
			dialect, _ := kind.SQLDialect()
			ctx := context.Background()
			db, err := anystore.OpenDB(ctx, anystore.StoreParams{Kind: kind})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			plain, quoted, kept := testkit.UniqueName("drop_"), testkit.UniqueName("drop_"), testkit.UniqueName("keep_")
			for _, table := range []string{plain, quoted, kept} {
				if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (x INTEGER)"); err != nil {
					t.Fatal(err)
				}
			}
			defer db.ExecContext(ctx, "DROP TABLE IF EXISTS "+kept) //nolint:errcheck
			q := `"`
			if kind == anystore.StoreMySQL {
				q = "`"
			}
			if err := sqltest.DropTables(ctx, db, dialect, plain, q+quoted+q, "never_created"); err != nil {
				t.Fatal(err)
			}
			for table, want := range map[string]bool{plain: false, quoted: false, kept: true} {
				_, err := db.ExecContext(ctx, "SELECT 1 FROM "+table+" WHERE 1 = 0")
				if exists := err == nil; exists != want {
					t.Errorf("table %s exists: %v, want %v", table, exists, want)
				}
			}
		})
	}
	if err := sqltest.DropTables(context.Background(), nil, sqlstore.Postgres, "t"); err == nil {
		t.Error("DropTables without a database did not fail")
	}
}

func TestClosedAddr(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Fatalf("something listens at %s", addr)
	}
}
