package expiringkeys_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// On the real stores, a Window, Lease or Scope beyond what the store
// keeps fails at New, naming both values, as the middleware's New does.
func TestRealStoreBoundsRefusedAtNew(t *testing.T) {
	cases := []struct {
		name   string
		params anystore.StoreParams
		cfg    expiringkeys.Config
		want   []string
	}{
		{"natsstore window", anystore.StoreParams{Kind: anystore.StoreNATS, NATS: natsstore.Config{MaxRetention: time.Hour}},
			expiringkeys.Config{Scope: "s", Window: 2 * time.Hour}, []string{"Window: window 2h0m0s", "natsstore's MaxRetention (1h0m0s)"}},
		{"natsstore lease", anystore.StoreParams{Kind: anystore.StoreNATS, NATS: natsstore.Config{MaxLease: time.Minute}},
			expiringkeys.Config{Scope: "s", Lease: 2 * time.Minute}, []string{"Lease: lease 2m0s", "MaxLease (1m0s)"}},
		{"partitioned postgres window", anystore.StoreParams{Kind: anystore.StorePostgres,
			SQL: sqlstore.Config{DailyPartitions: true, PartitionDaysAhead: 2, PurgeInterval: time.Hour}},
			expiringkeys.Config{Scope: "s", Window: 72 * time.Hour}, []string{"Window: window 72h0m0s", "MaxRetention (48h0m0s)"}},
		{"redisstore scope", anystore.StoreParams{Kind: anystore.StoreRedis, Redis: redisstore.Config{MaxKeyLen: 16}},
			expiringkeys.Config{Scope: strings.Repeat("s", 17)}, []string{"Scope: scope of 17 bytes", "redisstore's MaxScope (16 bytes)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			anystore.RequireStore(t, tc.params.Kind)
			tc.params.CreateSchema, tc.params.Teardown = true, true
			store := openStore(t, tc.params).Store
			_, err := expiringkeys.New(store, tc.cfg)
			if !errors.Is(err, dedup.ErrInvalidConfig) {
				t.Fatalf("New = %v, want an error wrapping dedup.ErrInvalidConfig", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		})
	}
}

// redisstore keeps keys verbatim up to its MaxKeyLen: a longer key fails
// with stores.ErrInvalidKey, naming the bound, and is never sent.
func TestRedisRefusesALongKey(t *testing.T) {
	anystore.RequireStore(t, anystore.StoreRedis)
	store := openStore(t, anystore.StoreParams{Kind: anystore.StoreRedis, Teardown: true}).Store
	repo := newRepo(t, store, expiringkeys.Config{Scope: "s"})
	long := strings.Repeat("k", redisstore.DefaultMaxKeyLen+1)
	dup, err := repo.IsDuplicate(context.Background(), long)
	if dup || !errors.Is(err, stores.ErrInvalidKey) || !strings.Contains(err.Error(), "longer than redisstore's MaxKey (1024 bytes)") {
		t.Fatalf("IsDuplicate of a %d-byte key = %t, %v; want an error wrapping stores.ErrInvalidKey naming MaxKey", len(long), dup, err)
	}
	mustSee(t, repo, long[1:], false, "a key of MaxKeyLen bytes")
}
