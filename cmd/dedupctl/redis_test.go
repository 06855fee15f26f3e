package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The done criterion, as written: a Redis URL alone names the
// store and where it is. Under the default prefix on a redis-server of
// the test's own (the shared Redis holds other programs' keys under
// "dedup:"), and under a prefix of the test's own on the shared one.
func TestRedisURL(t *testing.T) {
	own := redistest.StartRedis(t)
	ownClient := redis.NewClient(&redis.Options{Addr: own})
	defer ownClient.Close()
	writeRedisRecords(t, ownClient, redisstore.DefaultPrefix)
	url := "redis://" + own + "/0"
	dedupctl(t, "-redis-addr="+url, "stats").want(t, exitOK, "stdout:Redis "+url+`, prefix "dedup:"`, "stdout:records  5: 1 processing, 4 done")
	dedupctl(t, "-redis-addr="+url, "get", "loyalty", "done-1").want(t, exitOK, "stdout:done")
	dedupctl(t, "-redis-addr=redis://"+own+"/1", "get", "loyalty", "done-1").want(t, exitNotFound) // another database
	// A database the server does not have (16 by default: 0 to 15).
	dedupctl(t, "-redis-addr=redis://"+own+"/16", "stats").want(t, exitError, "stderr:Redis at redis://"+own+"/16 refused the connection", "stderr:DB index is out of range")

	// The shared Redis, records under a prefix of the test's own.
	addr := testkit.RequireRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	prefix := "dedup-url-" + storetest.NewID() + ":"
	t.Cleanup(func() { _ = redisclean.DeletePrefix(context.Background(), client, prefix) })
	writeRedisRecords(t, client, prefix)
	url = "redis://" + addr + "/0"
	dedupctl(t, "-redis-addr="+url, "-redis-prefix="+prefix, "stats").want(t, exitOK, "stdout:Redis "+url+`, prefix "`+prefix+`"`, "stdout:records  5: 1 processing, 4 done")
	dedupctl(t, "-redis-addr="+url, "-redis-prefix="+prefix, "get", "loyalty", "done-1").want(t, exitOK, "stdout:done")
	dedupctl(t, "-redis-addr=redis://"+addr+"/1", "-redis-prefix="+prefix, "get", "loyalty", "done-1").want(t, exitNotFound) // another database
}

// Flags of one store name it; of several, or only the environment's,
// none.
func TestImpliedStore(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-redis-addr=redis://h:1/0", "stats"}, nil, storeRedis},
		{[]string{"stats", "-redis-cluster", "-redis-addr=h:1,h:2"}, nil, storeRedis},
		{[]string{"-redis-prefix=x:", "-run-id=abc", "stats"}, nil, storeRedis},
		{[]string{"-postgres-dsn=postgres://h/db", "-table=t", "stats"}, nil, storePostgres},
		{[]string{"-mysql-dsn=u@tcp(h:1)/db", "stats"}, nil, storeMySQL},
		{[]string{"-sqlite-file=x.db", "stats"}, nil, storeSQLite},
		{[]string{"-nats-url=nats://h:1", "stats"}, nil, storeNATS},
		{[]string{"-store=postgres", "-redis-addr=h:1", "stats"}, nil, storePostgres},
		{[]string{"-redis-addr=h:1", "stats"}, map[string]string{"DEDUP_STORE": "mysql"}, storeMySQL},
		{[]string{"-redis-addr=h:1", "-postgres-dsn=postgres://h/db", "stats"}, nil, ""},
		{[]string{"stats"}, map[string]string{"REDIS_ADDR": "h:1"}, ""},
		{[]string{"-redis-addr=h:1", "window", "-horizon=1h", "-rate=1"}, nil, ""},
	} {
		env := func(k string) string { return tc.env[k] }
		cfg, _, _, err := parseArgs(tc.args, env)
		if cfg.store != tc.want {
			t.Errorf("%q (env %v): store %q, %v; want %q", tc.args, tc.env, cfg.store, err, tc.want)
		}
		if tc.want == "" && !strings.Contains(tc.args[len(tc.args)-1], "rate") {
			dedupctlEnv(t, tc.env, tc.args...).want(t, exitUsage, "stderr:no store: set -store", "stderr:or give the address flag of one store only")
		}
	}
}

// writeRedisRecords writes, under prefix, a done record (done-1), a
// processing one (held-1) and three more done ones (batch-1..3), in scope
// loyalty.
func writeRedisRecords(t *testing.T, client redis.UniversalClient, prefix string) {
	t.Helper()
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, SkipServerCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	ctx := t.Context()
	for _, k := range []string{"done-1", "held-1", "batch-1", "batch-2", "batch-3"} {
		c, err := s.Claim(ctx, "loyalty", []string{k}, time.Hour)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim(%q) = %+v, %v", k, c, err)
		}
		if k != "held-1" {
			if err := s.Complete(ctx, c, time.Hour, []byte("fingerprint")); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRedisACLUser runs every command as an ACL user made with the
// README's least-privilege rule (no CONFIG, no INFO, nothing outside the
// prefix), given in a redis:// URL, on a redis-server and a Redis Cluster
// of the test's own; no output shows the password.
func TestRedisACLUser(t *testing.T) {
	rule := redistest.RedisACLRules(t)[0]
	user, password := "dedupctl-"+storetest.NewID(), "pw-"+storetest.NewID()
	prefix := "dedup:" + storetest.NewID() + ":"
	run := func(t *testing.T, args ...string) result {
		t.Helper()
		r := dedupctl(t, args...)
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the output shows the password: %s", r)
		}
		return r
	}
	commands := func(t *testing.T, conn ...string) {
		args := func(more ...string) []string {
			return append(append(append([]string{}, conn...), "-redis-prefix="+prefix), more...)
		}
		run(t, args("stats")...).want(t, exitOK, "stdout:5", "stdout:xxxxx")
		run(t, args("stats", "-json")...).want(t, exitOK, `stdout:"store":`, "stdout:xxxxx")
		run(t, args("list", "loyalty")...).want(t, exitOK, "stdout:batch-2", "stdout:held-1")
		run(t, args("list", "loyalty", "-state=processing", "-json")...).want(t, exitOK, "stdout:held-1")
		run(t, args("get", "loyalty", "done-1")...).want(t, exitOK, "stdout:done")
		run(t, args("forget", "loyalty", "done-1")...).want(t, exitRefused, "stdout:would forget")
		run(t, args("forget", "loyalty", "done-1", "-yes")...).want(t, exitOK)
		run(t, args("get", "loyalty", "done-1")...).want(t, exitNotFound, "stderr:xxxxx")
		run(t, args("forget", "loyalty", "-prefix=batch-", "-all", "-yes", "-json")...).want(t, exitOK, "stdout:batch-3")
		run(t, args("release", "loyalty", "held-1", "-yes")...).want(t, exitOK)
		run(t, args("purge")...).want(t, exitOK, "stdout:Redis deletes expired records by itself")
		run(t, args("stats", "-json")...).want(t, exitOK, `stdout:"total": 0`)
	}
	t.Run("server", func(t *testing.T) {
		addr := redistest.StartRedis(t)
		admin := redis.NewClient(&redis.Options{Addr: addr})
		defer admin.Close()
		redistest.SetRedisACLUser(t, admin, rule, user, password, prefix)
		writeRedisRecords(t, admin, prefix)
		url := "redis://" + user + ":" + password + "@" + addr + "/0"
		commands(t, "-redis-addr="+url)

		// From the environment, as the docs advise.
		dedupctlEnv(t, map[string]string{"REDIS_ADDR": url, "DEDUP_STORE": "redis", "DEDUP_REDIS_PREFIX": prefix}, "stats").want(t, exitOK, "stdout:redis://"+user+":xxxxx@"+addr+"/0")

		// A wrong password, a user denied the prefix: refused, and said so
		// without the password.
		wrong := "redis://" + user + ":not-" + password + "@" + addr + "/0"
		r := run(t, "-redis-addr="+wrong, "stats").want(t, exitError, "stderr:Redis at redis://"+user+":xxxxx@"+addr+"/0 refused the connection", "stderr:WRONGPASS")
		if strings.Contains(r.stderr, "not-") {
			t.Fatalf("the error shows the password: %s", r)
		}
		run(t, "-redis-addr="+url, "-redis-prefix=elsewhere:", "get", "loyalty", "done-1").want(t, exitError, "stderr:NOPERM")
	})
	t.Run("cluster", func(t *testing.T) {
		nodes := redistest.StartRedisCluster(t)
		urls := make([]string, len(nodes))
		for i, a := range nodes {
			admin := redis.NewClient(&redis.Options{Addr: a})
			redistest.SetRedisACLUser(t, admin, rule, user, password, prefix)
			_ = admin.Close()
			urls[i] = "redis://" + user + ":" + password + "@" + a
		}
		admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes})
		defer admin.Close()
		writeRedisRecords(t, admin, prefix)
		commands(t, "-redis-cluster", "-redis-addr="+strings.Join(urls[:2], ","))

		// A node alone, as the user: told to add -redis-cluster (CLUSTER
		// SLOTS, which the rule allows, tells a node).
		run(t, "-redis-addr="+urls[0], "stats").want(t, exitUsage, "stderr:is a node of a Redis Cluster: add -redis-cluster", "stderr:xxxxx")
		// One URL naming the other nodes, go-redis's Cluster URL.
		run(t, "-redis-cluster", "-redis-addr="+urls[0]+"?addr="+nodes[1], "-redis-prefix="+prefix, "stats").want(t, exitOK, "stdout:Redis Cluster redis://"+user+":xxxxx@")
	})
}

// TestRedisTLS: dedupctl reaches a Redis that speaks TLS only and asks
// for a client certificate, with a rediss:// URL and the CA and client
// certificate flags (or their environment variables); without the CA or
// the certificate it is refused, and says why.
func TestRedisTLS(t *testing.T) {
	addr, files := redistest.StartRedisTLS(t, true)
	admin := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, true)})
	defer admin.Close()
	prefix := "dedup:" + storetest.NewID() + ":"
	writeRedisRecords(t, admin, prefix)
	port := addr[strings.LastIndex(addr, ":")+1:]
	ca, cert, key := "-redis-ca="+files.CA, "-redis-cert="+files.ClientCert, "-redis-key="+files.ClientKey
	for _, host := range []string{"127.0.0.1", "localhost"} {
		url := "rediss://" + host + ":" + port + "/0"
		dedupctl(t, "-redis-addr="+url, ca, cert, key, "-redis-prefix="+prefix, "stats").want(t, exitOK, "stdout:Redis "+url, "stdout:5")
	}
	url := "rediss://" + addr
	dedupctlEnv(t, map[string]string{
		"REDIS_ADDR": url, "DEDUP_REDIS_CA": files.CA, "DEDUP_REDIS_CERT": files.ClientCert, "DEDUP_REDIS_KEY": files.ClientKey,
	}, "-store=redis", "-redis-prefix="+prefix, "get", "loyalty", "done-1").want(t, exitOK, "stdout:done")

	dedupctl(t, "-redis-addr="+url, cert, key, "stats").want(t, exitError, "stderr:Redis is not reachable at "+url, "stderr:certificate signed by unknown authority")
	// Under TLS 1.3 the server checks the client's certificate after the
	// client's side of the handshake is done: the client reads the
	// server's alert, or, when it writes first, a reset.
	noCert := dedupctl(t, "-redis-addr="+url, ca, "stats").want(t, exitError, "stderr:"+url)
	if !strings.Contains(noCert.stderr, "certificate required") && !strings.Contains(noCert.stderr, "connection reset by peer") {
		t.Fatalf("stderr says neither the server's alert nor its reset: %s", noCert)
	}
	dedupctl(t, "-redis-addr="+addr, ca, "stats").want(t, exitUsage, "stderr:-redis-ca or DEDUP_REDIS_CA: TLS needs a rediss:// URL")
	dedupctl(t, "-redis-addr="+url, ca, cert, "stats").want(t, exitUsage, "stderr:-redis-key or DEDUP_REDIS_KEY: a client certificate needs its key")
}

// A rediss:// URL to a Redis without TLS says the server did not complete
// a TLS handshake, and maybe does not speak TLS: it said "no answer
// within 3s".
func TestRedisTLSToPlaintext(t *testing.T) {
	addr := testkit.RequireRedis(t)
	dedupctl(t, "-store=redis", "-redis-addr=rediss://"+addr, "stats").want(t, exitError,
		"stderr:Redis is not reachable at rediss://"+addr, "stderr:did not complete a TLS handshake", "stderr:does not speak TLS")
}

// A URL that does not parse, or a server that does not answer, is
// reported without the password.
func TestRedisURLErrors(t *testing.T) {
	const password = "hunter2secret"
	closed := testkit.ClosedAddr(t)
	for _, tc := range []struct {
		addr string
		code int
		says string
	}{
		{"redis://u:" + password + "@" + closed + "/0", exitError, "Redis is not reachable at redis://u:xxxxx@" + closed + "/0 (change it with -redis-addr or REDIS_ADDR)"},
		{"redis://u:" + password + "@" + closed + "/zero", exitUsage, "-redis-addr or REDIS_ADDR: redis://u:xxxxx@" + closed + "/zero: redis: invalid database number"},
		{"redis://u:hunter2#" + password + "@" + closed, exitUsage, "not a valid URL"},
		{"u:" + password + "@" + closed, exitUsage, "must be a URL"},
		{"redis://u:" + password + "@" + closed + ",redis://u:" + password + "@" + closed, exitUsage, "add -redis-cluster"},
		{"redis://u:1234," + password + "@" + closed + "/0", exitUsage, "not a valid URL"}, // a ',' in the password
		{"u:" + password + "@" + closed + "," + closed, exitUsage, "must be a URL"},
		{"redis://u:" + password + "@" + closed + "/-1", exitUsage, "names database -1: a database number is 0 or more"},
	} {
		r := dedupctl(t, "-store=redis", "-redis-addr="+tc.addr, "stats").want(t, tc.code, "stderr:"+tc.says)
		if strings.Contains(r.stdout+r.stderr, "hunter2") {
			t.Errorf("-redis-addr=%s: the output shows the password: %s", tc.addr, r)
		}
	}
}
