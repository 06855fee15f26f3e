package expiringkeys_test

import (
	"context"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
)

// storeKinds are the stores the Deduplicator's tests run on: every
// backend, on the real services, and a Redis Cluster of the test's own.
var storeKinds = []anystore.StoreKind{
	anystore.StoreMemory, anystore.StoreRedis, anystore.StoreRedisCluster,
	anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreSQLite, anystore.StoreNATS,
}

// forEachStore runs test in a subtest per store kind, with two stores
// sharing their records, as two processes would: the same memstore, or
// two clients of the same table, key prefix or bucket.
func forEachStore(t *testing.T, test func(t *testing.T, store, peer stores.Store)) {
	for _, kind := range storeKinds {
		t.Run(string(kind), func(t *testing.T) {
			p := anystore.StoreParams{Kind: kind}
			if kind == anystore.StoreRedisCluster {
				p.Addr = strings.Join(redistest.StartRedisCluster(t), ",")
			}
			store, peer := openStores(t, p)
			test(t, store, peer)
		})
	}
}

// openStores opens a store of the test's own, deleted at the end of the
// test, and a second store on its records (the same store for memstore).
func openStores(t *testing.T, p anystore.StoreParams) (store, peer stores.Store) {
	t.Helper()
	if p.Addr == "" {
		anystore.RequireStore(t, p.Kind)
	}
	first := p
	first.Teardown, first.CreateSchema = true, true
	o := openStore(t, first)
	if p.Kind == anystore.StoreMemory {
		return o.Store, o.Store
	}
	p.Name, p.Path = o.Name, o.Path
	return o.Store, openStore(t, p).Store
}

func openStore(t *testing.T, p anystore.StoreParams) *anystore.OpenedStore {
	t.Helper()
	o, closeStore, err := anystore.OpenStore(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := closeStore(context.Background()); err != nil {
			t.Errorf("closing the %s store: %v", p.Kind, err)
		}
	})
	return o
}

func newRepo(t *testing.T, store stores.Store, cfg expiringkeys.Config) *expiringkeys.Repository {
	return testkit.MustNew(t, expiringkeys.New, store, cfg)
}

func mustSee(t *testing.T, r *expiringkeys.Repository, key string, want bool, why string) {
	t.Helper()
	testkit.MustSee(t, r, key, want, why)
}
