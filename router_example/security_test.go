package main

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
)

// TestExampleRedisACLAndTLS runs the example on a Redis of the test's own
// that speaks TLS only, with a private CA and client certificates, as an
// ACL user made with stores/redisstore/README.md's least-privilege rule,
// reached by a rediss:// URL: from the environment (as the README
// advises for a password) and from the flags. The run holds the
// invariant, cleans up after itself as that user, and no output shows
// the password; a wrong password or an untrusted server is refused, and
// said so without it. Redis Streams, as the broker, runs over TLS too.
func TestExampleRedisACLAndTLS(t *testing.T) {
	buildExample(t)
	addr, files := redistest.StartRedisTLS(t, true)
	admin := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, true)})
	defer admin.Close()
	id := newTestRunID()
	user, password := "example-"+id, "pw-"+id+"-secret"
	// The store's rule, on the prefix of the example's runs.
	redistest.SetRedisACLUser(t, admin, redistest.RedisACLRules(t)[0], user, password, redisRunsPrefix)
	url := "rediss://" + user + ":" + password + "@" + addr + "/0"
	shown := "rediss://" + user + ":xxxxx@" + addr + "/0"
	tlsEnv := []string{"DEDUP_REDIS_CA=" + files.CA, "DEDUP_REDIS_CERT=" + files.ClientCert, "DEDUP_REDIS_KEY=" + files.ClientKey}
	tlsFlags := []string{"-redis-ca=" + files.CA, "-redis-cert=" + files.ClientCert, "-redis-key=" + files.ClientKey}
	noPassword := func(t *testing.T, r exampleRun) {
		t.Helper()
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the output shows the password\n%s", r)
		}
	}
	noKeys := func(t *testing.T, runID string) {
		t.Helper()
		keys, _, err := admin.Scan(context.Background(), 0, redisPrefix(runID)+"*", 1000).Result()
		if err != nil || len(keys) > 0 {
			t.Fatalf("-cleanup left %d keys under %s (%v)", len(keys), redisPrefix(runID), err)
		}
	}

	t.Run("ACL user, URL in the environment", func(t *testing.T) {
		runID := newTestRunID()
		r := runExampleEnv(t, runID, append(tlsEnv, "REDIS_ADDR="+url), "-store=redis", "-crash-rate=0.02", "-lease=300ms")
		requireOK(t, r)
		noPassword(t, r)
		if !strings.Contains(r.stdout, "redis ("+shown+")") {
			t.Fatalf("the summary does not show the store as %s\n%s", shown, r)
		}
		noKeys(t, runID)
	})
	t.Run("ACL user, URL in the flags", func(t *testing.T) {
		runID := newTestRunID()
		r := runExample(t, runID, append([]string{"-store=redis", "-redis-addr=" + url}, tlsFlags...)...)
		requireOK(t, r)
		noPassword(t, r)
		noKeys(t, runID)
	})
	t.Run("redis-streams over TLS", func(t *testing.T) {
		runID := newTestRunID()
		r := runExampleEnv(t, runID, append(tlsEnv, "REDIS_ADDR=rediss://"+addr), "-broker=redis-streams", "-store=redis")
		requireOK(t, r)
		if !strings.Contains(r.stdout, "rediss://"+addr) {
			t.Fatalf("the summary does not show the broker's URL\n%s", r)
		}
		noKeys(t, runID)
	})
	t.Run("ACL user on another key prefix", func(t *testing.T) {
		// The README's rule as written (~dedup:*): the store answers, but
		// refuses every write under the run's prefix. The run stops at
		// once, naming the refusal, instead of failing each message until
		// -timeout.
		other := "example-other-" + id
		redistest.SetRedisACLUser(t, admin, redistest.RedisACLRules(t)[0], other, password, "dedup:")
		url := "rediss://" + other + ":" + password + "@" + addr + "/0"
		r := runExampleEnv(t, newTestRunID(), append(tlsEnv, "REDIS_ADDR="+url), "-store=redis")
		if !refusedSaying(t, r, []string{"refused a trial claim before the run", "NOPERM"}) {
			return
		}
		noPassword(t, r)
	})
	t.Run("refused", func(t *testing.T) {
		wrong := "rediss://" + user + ":not-" + password + "@" + addr + "/0"
		r := runExampleEnv(t, newTestRunID(), append(tlsEnv, "REDIS_ADDR="+wrong), "-store=redis")
		if r.code != exitConfig || !strings.Contains(r.stderr, "Redis at "+shown+" refused the connection") || !strings.Contains(r.stderr, "WRONGPASS") {
			t.Fatalf("want exit 2 and a refusal naming %s\n%s", shown, r)
		}
		noPassword(t, r)
		// No -redis-ca: the private CA is not trusted.
		r = runExampleEnv(t, newTestRunID(), []string{"REDIS_ADDR=" + url}, "-store=redis")
		if r.code != exitConfig || !strings.Contains(r.stderr, "not reachable at "+shown) || !strings.Contains(r.stderr, "certificate signed by unknown authority") {
			t.Fatalf("want exit 2 and an untrusted certificate\n%s", r)
		}
		noPassword(t, r)
		requireOnlyOwnLines(t, r) // go-redis's pool logged its failed dial there
		// A password with a '#' that was not percent-encoded.
		r = runExample(t, newTestRunID(), "-store=redis", "-redis-addr=rediss://"+user+":12#"+password+"@"+addr)
		if r.code != exitConfig || !strings.Contains(r.stderr, "-redis-addr or REDIS_ADDR: not a valid URL") {
			t.Fatalf("want exit 2 and an invalid URL\n%s", r)
		}
		noPassword(t, r)
	})
}

// The Redis settings: a URL from the YAML file, the TLS files' flags
// ignored without Redis, and a bad setting refused at start-up without
// its password.
func TestRedisSettings(t *testing.T) {
	ca := testkit.MakeTLSFiles(t).CA
	file := writeFile(t, "redis.yml", "store: redis\nredis-addr: rediss://dedup:s3cret@redis.internal:6380/0\nredis-ca: "+ca+"\n")
	cfg, err := loadConfig([]string{"-config", file}, env(nil), io.Discard)
	if err != nil || cfg.RedisAddr != "rediss://dedup:s3cret@redis.internal:6380/0" || cfg.RedisTLS.CAFile != ca {
		t.Fatalf("from the file: %q, %q, %v", cfg.RedisAddr, cfg.RedisTLS.CAFile, err)
	}
	cfg, err = loadConfig([]string{"-redis-ca=ca.pem", "-redis-key=k.pem"}, env(nil), io.Discard)
	if err != nil || !slices.Contains(cfg.warnings(), "-redis-ca is ignored without -store=redis or -broker=redis-streams") ||
		!slices.Contains(cfg.warnings(), "-redis-key is ignored without -store=redis or -broker=redis-streams") {
		t.Fatalf("warnings %q, %v", cfg.warnings(), err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-store=redis", "-redis-addr=redis://u:s3cret@h:1/x"}, "-redis-addr or REDIS_ADDR: redis://u:xxxxx@h:1/x: redis: invalid database number"},
		{[]string{"-broker=redis-streams", "-redis-addr=u:s3cret@h:1"}, "must be a URL"},
		{[]string{"-store=redis", "-redis-addr=h:1", "-redis-ca=ca.pem"}, "-redis-ca or DEDUP_REDIS_CA: TLS needs a rediss:// URL"},
		{[]string{"-store=redis", "-redis-addr=h:1,h:2"}, "for one Redis"},
	} {
		_, err := loadConfig(tc.args, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v, want an error saying %q without the password", tc.args, err, tc.want)
		}
	}
}
