package redisstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// How the store gets in: as an ACL user of the least privilege it needs
// (TestACL, TestACLWait), and over TLS with a client certificate
// (TestTLS).

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
	rules := redistest.RedisACLRules(t)
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
			redistest.SetRedisACLUser(t, admin, rule, user, password, aclPrefix)
			c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			testACLUser(t, c, admin)

			if i > 0 && testing.Short() {
				return // the cluster runs the least privilege only
			}
			t.Run("cluster", func(t *testing.T) {
				if cluster == nil {
					cluster = redistest.StartRedisCluster(outer) // for every rule
				}
				for _, a := range cluster {
					redistest.SetRedisACLUser(t, newClient(t, a), rule, user, password, aclPrefix)
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

// TestACLWait: with Config.WaitReplicas the store also sends WAIT, and
// its fenced scripts PEXPIRE the key that refuses a call (so that the
// WAIT covers it), which README.md adds to the rule as +wait +pexpire:
// the conformance suite passes as a user with them, on a primary with a
// replica of the test's own, and a user without them is refused
// (NOPERM), not taken for an outage.
func TestACLWait(t *testing.T) {
	rule := append(redistest.RedisACLRules(t)[0], "+wait", "+pexpire")
	primary := startRedis(t)
	admin := newClient(t, primary)
	host, port, _ := strings.Cut(primary, ":")
	replica := newClient(t, startRedis(t, "--replicaof", host, port))
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := replica.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica is not in sync after a minute: %v\n%s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	user, password := "dedup-"+storetest.NewID(), storetest.NewID()
	redistest.SetRedisACLUser(t, admin, rule, user, password, aclPrefix)
	c := redis.NewClient(&redis.Options{Addr: primary, Username: user, Password: password, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	storetest.Run(t, aclFactory(c, redisstore.Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second}), serverTime(admin))

	t.Run("CheckServer", func(t *testing.T) {
		s, err := redisstore.New(c, redisstore.Config{Prefix: aclPrefix + storetest.NewID() + ":", WaitReplicas: 1, SkipServerCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		if err := s.CheckServer(context.Background()); err != nil {
			t.Fatalf("CheckServer as a user with +wait +pexpire: %v", err)
		}
	})

	// A user denied WAIT, or PEXPIRE, or both: CheckServer says which,
	// and the rule to fix; a Claim fails (NOPERM, not an outage) and
	// leaves no claim behind.
	for _, tc := range []struct {
		name, denied string
		rule         []string
	}{
		{"without +wait +pexpire", "WAIT, PEXPIRE", rule[:len(rule)-2]},
		{"without +pexpire", "PEXPIRE", rule[:len(rule)-1]},
		{"without +wait", "WAIT", append(rule[:len(rule)-2:len(rule)-2], "+pexpire")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := "dedup-" + storetest.NewID()
			redistest.SetRedisACLUser(t, admin, tc.rule, user, password, aclPrefix)
			c := redis.NewClient(&redis.Options{Addr: primary, Username: user, Password: password, ContextTimeoutEnabled: true})
			defer c.Close()
			log := watermill.NewCaptureLogger()
			s, err := redisstore.New(c, redisstore.Config{Prefix: aclPrefix + storetest.NewID() + ":", WaitReplicas: 1, SkipServerCheck: true, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			err = s.CheckServer(context.Background())
			errtest.Wraps(t, "CheckServer as "+tc.name, err, redisstore.ErrWaitDenied)
			if err != nil && (!strings.Contains(err.Error(), "denied "+tc.denied+")") || !strings.Contains(err.Error(), "+wait +pexpire")) {
				t.Errorf("CheckServer as %s: %v, want it to name %s and the rule's +wait +pexpire", tc.name, err, tc.denied)
			}
			if len(log.Captured()[watermill.ErrorLogLevel]) == 0 {
				t.Error("CheckServer logged no error")
			}
			if !strings.Contains(tc.denied, "WAIT") {
				return // claims work; refusals fail (their PEXPIRE)
			}
			_, err = s.Claim(context.Background(), "s", []string{"k"}, time.Minute)
			if err == nil || !strings.Contains(err.Error(), "NOPERM") || errors.Is(err, stores.ErrUnavailable) {
				t.Fatalf("Claim with WaitReplicas as a user denied WAIT: %v, want an unclassified NOPERM", err)
			}
			if n, err := admin.Exists(context.Background(), s.EncodeKey("s", "k")).Result(); err != nil || n != 0 {
				t.Fatalf("the Claim that failed left its key held: EXISTS = %d, %v", n, err)
			}
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
			storetest.Run(t, aclFactory(client, redisstore.Config{Batch: batch}), serverTime(admin))
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

// aclFactory opens each store of the suite on client (as the ACL user)
// with cfg, under a prefix of its own below aclPrefix; the background
// server check runs too, as the user.
func aclFactory(client redis.UniversalClient, cfg redisstore.Config) storetest.Factory {
	return func(t *testing.T, _ stores.Clock) stores.Store {
		cfg := cfg
		cfg.Prefix = aclPrefix + storetest.NewID() + ":"
		s, err := redisstore.New(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
}

// TestTLS runs the conformance suite over TLS, on a redis-server of its
// own that speaks TLS only and requires a client certificate, with
// certificates of a private CA the test makes; and checks that a client
// that does not trust the CA, or has no certificate, is refused.
func TestTLS(t *testing.T) {
	addr, files := redistest.StartRedisTLS(t, true)
	newTLSClient := func(t testing.TB, withCert bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, withCert), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	client := newTLSClient(t, true)
	storetest.Run(t, factory(client, redisstore.Config{}), serverTime(client))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newStore(t, client, redisstore.Config{})
	if err := s.CheckServer(ctx); err != nil {
		t.Errorf("CheckServer over TLS: %v", err)
	}
	if _, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil {
		t.Fatal(err)
	}

	t.Run("refused", func(t *testing.T) {
		// A server that refuses the client's certificate (its TLS alert:
		// none given, or one of another CA) refuses a setting, as it
		// does a wrong password: not an outage, which FailOpen would run
		// handlers through, unprotected, for as long as it lasts.
		other := testkit.MakeTLSFiles(t)
		otherCert := files.ClientConfig(t, false)
		otherCert.Certificates = other.ClientConfig(t, true).Certificates
		for name, cfg := range map[string]*tls.Config{"without a certificate": files.ClientConfig(t, false), "with a certificate of another CA": otherCert} {
			c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			_, err := newStore(t, c, redisstore.Config{Prefix: s.Prefix()}).Claim(ctx, "s", []string{"k"}, time.Minute)
			if err == nil {
				t.Errorf("a client %s was let in", name)
			} else if errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, redisstore.ErrRefused) || !strings.Contains(err.Error(), "remote error: tls") {
				t.Errorf("a client %s: %v, want the server's TLS alert, ErrRefused, not an outage", name, err)
			}
		}
		untrusting := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, MaxRetries: -1})
		defer untrusting.Close()
		if err := untrusting.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a client that does not trust the CA: %v, want a certificate error", err)
		}
		plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Error("a client without TLS was answered")
		}
	})
}
