package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
	"github.com/watermill-dedup/dedup/testkit"
)

// aclPrefix is the key prefix the ACL users of these tests may touch;
// each store writes under a prefix of its own inside it.
const aclPrefix = "dedup-acl:"

// TestACL runs the store as an ACL user made with each rule README.md
// documents, restricted to the store's key prefix and denied CONFIG and
// INFO (@dangerous): the conformance suite, with batching on and off,
// the server check (which must log the refused CONFIG and go on) and a
// prefix outside the rule's, on a redis-server of its own and on a Redis
// Cluster. The shared Redis's users are never touched.
func TestACL(t *testing.T) {
	rules := testkit.RedisACLRules(t)
	addr := startRedis(t)
	admin := newClient(t, addr)
	var cluster []string
	outer := t
	for i, rule := range rules {
		name := "least privilege"
		if i > 0 {
			name = "alternative " + strconv.Itoa(i)
		}
		t.Run(name, func(t *testing.T) {
			t.Logf("ACL SETUSER <user> %s", strings.Join(rule, " "))
			user, password := "dedup-"+storetest.NewID(), storetest.NewID()
			testkit.SetRedisACLUser(t, admin, rule, user, password, aclPrefix)
			c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			testACLUser(t, c, admin)

			if i > 0 && testing.Short() {
				return // the cluster runs the least privilege only
			}
			t.Run("cluster", func(t *testing.T) {
				if cluster == nil {
					cluster = testkit.StartRedisCluster(outer) // for every rule
				}
				for _, a := range cluster {
					testkit.SetRedisACLUser(t, newClient(t, a), rule, user, password, aclPrefix)
				}
				cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster, Username: user, Password: password, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = cc.Close() })
				ac := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = ac.Close() })
				testACLUser(t, cc, ac)
			})
		})
	}
}

// testACLUser runs the store on client, an ACL user's, and moves time
// with admin, the default user's (the suite's ageing is no command of
// the store's).
func testACLUser(t *testing.T, client, admin redis.UniversalClient) {
	ctx := context.Background()
	if err := client.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("CONFIG GET as the ACL user: %v, want NOPERM", err)
	}

	t.Run("CheckServer", func(t *testing.T) {
		log := watermill.NewCaptureLogger()
		s, err := redisstore.New(client, redisstore.Config{Prefix: aclPrefix + storetest.NewID() + ":", Logger: log, SkipServerCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		if err := s.CheckServer(ctx); err != nil {
			t.Fatalf("CheckServer as a user denied CONFIG: %v, want nil", err)
		}
		infos := log.Captured()[watermill.InfoLogLevel]
		if len(infos) != 1 || !strings.Contains(infos[0].Msg, "CONFIG GET refused") || !strings.Contains(infos[0].Fields["nodes"].(string), "NOPERM") {
			t.Fatalf("want one info saying CONFIG GET was refused (NOPERM), got %v", infos)
		}
		if errs := log.Captured()[watermill.ErrorLogLevel]; len(errs) > 0 {
			t.Fatalf("CheckServer logged errors: %v", errs)
		}
	})

	for _, batch := range []redisstore.BatchConfig{{}, {Disabled: true}} {
		name := "batched"
		if batch.Disabled {
			name = "unbatched"
		}
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, _ stores.Clock) stores.Store {
				// The background server check runs too, as the user.
				s, err := redisstore.New(client, redisstore.Config{Prefix: aclPrefix + storetest.NewID() + ":", Batch: batch})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close(context.Background()) })
				return s
			}, serverTime(admin))
		})
	}

	t.Run("outside the prefix", func(t *testing.T) {
		s, err := redisstore.New(client, redisstore.Config{Prefix: "elsewhere:", SkipServerCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		_, err = s.Claim(ctx, "s", []string{"k"}, time.Minute)
		if err == nil || !strings.Contains(err.Error(), "NOPERM") || errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("Claim outside the user's keys: %v, want an unclassified NOPERM", err)
		}
	})
}
