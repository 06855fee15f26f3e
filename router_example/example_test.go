package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/amqptest"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
)

// The example binary, built once per test run (with -race when the tests
// run with it, so the example is race-checked too).
var exampleBin struct {
	once sync.Once
	path string
	err  error
}

func buildExample(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the example binary")
	}
	exampleBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "router_example-test-")
		if err != nil {
			exampleBin.err = err
			return
		}
		exampleBin.path = filepath.Join(dir, "router_example")
		args := []string{"build", "-buildvcs=false", "-o", exampleBin.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			exampleBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if exampleBin.err != nil {
		t.Fatal(exampleBin.err)
	}
	return exampleBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if exampleBin.path != "" {
		_ = os.RemoveAll(filepath.Dir(exampleBin.path))
	}
	os.Exit(code)
}

// exampleRun is one finished run of the binary.
type exampleRun struct {
	args   []string
	code   int
	stdout string
	stderr string
}

func (r exampleRun) String() string {
	return fmt.Sprintf("router_example %s: exit %d\n--- stdout ---\n%s\n--- stderr (last 3000 bytes) ---\n%s",
		strings.Join(r.args, " "), r.code, r.stdout, tail(r.stderr, 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// invariant is the summary's verdict line.
func (r exampleRun) invariant() string {
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, "invariant: ") {
			return l
		}
	}
	return ""
}

// count reads a number from a summary row.
func (r exampleRun) count(t *testing.T, label string) int64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) + `\s+(\d+)`)
	m := re.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("summary has no row %q\n%s", label, r)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// exampleEnv is the test's environment without DEDUP_* settings, which
// would change the runs.
func exampleEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEDUP_") {
			env = append(env, kv)
		}
	}
	return env
}

func newTestRunID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// runExample runs the binary to completion with the common flags of the
// tests: few events, cleanup, a unique run id.
func runExample(t *testing.T, runID string, args ...string) exampleRun {
	t.Helper()
	return runExampleEnv(t, runID, nil, args...)
}

// runExampleEnv is runExample with extra environment variables.
func runExampleEnv(t *testing.T, runID string, env []string, args ...string) exampleRun {
	t.Helper()
	return execExample(t, env, append([]string{"-events=200", "-cleanup", "-timeout=90s", "-run-id=" + runID}, args...)...)
}

// execExample runs the binary to completion with args alone, and the
// test's environment with env added.
func execExample(t *testing.T, env []string, args ...string) exampleRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	return runBinary(ctx, t, "", append(exampleEnv(), env...), args)
}

// runBinary runs the example's binary in dir (the test's own when empty)
// with env as its whole environment, until it exits or ctx is done.
func runBinary(ctx context.Context, t *testing.T, dir string, env, args []string) exampleRun {
	t.Helper()
	cmd := exec.CommandContext(ctx, buildExample(t), args...)
	cmd.Env, cmd.Dir = env, dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := exampleRun{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

var startLine = regexp.MustCompile(`(?m)^router_example: run [a-z0-9]+ \(seed \d+\): broker [a-z-]+, store [a-z]+, mode \S.*; publishing \d+ messages of \d+ events$`)

// requireOK checks a run that must hold the invariant.
func requireOK(t *testing.T, r exampleRun) {
	t.Helper()
	if r.code != exitOK || !strings.HasPrefix(r.invariant(), "invariant: OK") {
		t.Fatalf("want exit 0 and an OK invariant, got %q\n%s", r.invariant(), r)
	}
	if strings.Contains(r.stderr, "DATA RACE") {
		t.Fatalf("data race in the example\n%s", r)
	}
	if strings.Contains(r.stderr, "cleanup:") {
		t.Fatalf("cleanup failed\n%s", r)
	}
	// What runs is said when it starts, not only in the summary.
	if !startLine.MatchString(r.stderr) {
		t.Fatalf("no start line naming the broker, store and mode\n%s", r)
	}
	if strings.Contains(r.stderr, "error=<nil>") {
		t.Fatalf("an error logged without an error\n%s", r)
	}
	t.Log(r.invariant())
}

// TestExampleRuns runs the example on every broker the machine has, and on
// the store combinations, each with faults injected, and checks the
// summary's invariant line and the exit status.
func TestExampleRuns(t *testing.T) {
	buildExample(t)

	type combo struct {
		name  string
		args  []string
		needs func(t *testing.T) []string // services; returns extra flags
		check func(t *testing.T, r exampleRun, runID string)
	}
	pg := func(t *testing.T) []string { return []string{"-postgres-dsn=" + testkit.RequirePostgres(t)} }
	my := func(t *testing.T) []string { return []string{"-mysql-dsn=" + testkit.RequireMySQL(t)} }
	rd := func(t *testing.T) []string { return []string{"-redis-addr=" + testkit.RequireRedis(t)} }
	mq := func(t *testing.T) []string { return []string{"-amqp-url=" + testkit.RequireAMQP(t)} }
	nt := func(t *testing.T) []string { return []string{"-nats-url=" + testkit.RequireNATS(t)} }
	both := func(a, b func(*testing.T) []string) func(*testing.T) []string {
		return func(t *testing.T) []string { return append(a(t), b(t)...) }
	}
	noTables := func(dsn func(*testing.T) []string, driver string) func(*testing.T, exampleRun, string) {
		return func(t *testing.T, _ exampleRun, runID string) {
			requireNoTables(t, driver, strings.SplitN(dsn(t)[0], "=", 2)[1], runID)
		}
	}
	// foreign checks a -producer=foreign run with -stale-events=2: the
	// summary names the producer and the key, the duplicates were caught
	// by it, and the stale events' publication time, read where the
	// broker's keyfuncs read it, made them ttl misses.
	foreign := func(key string, more func(*testing.T, exampleRun, string)) func(*testing.T, exampleRun, string) {
		return func(t *testing.T, r exampleRun, runID string) {
			if !strings.Contains(r.stdout, "\n  producer   foreign (") || !strings.Contains(r.stdout, "\n  keys       "+key+" + payment:<payment_id>") {
				t.Errorf("the summary does not name the foreign producer and the key %s\n%s", key, r)
			}
			requireStaleAndOnce(t, r)
			if more != nil {
				more(t, r, runID)
			}
		}
	}

	combos := []combo{
		// The embedded default, with every fault: failures, lost acks,
		// crashes (rolled back) and stale messages (ttl misses).
		{name: "gochannel/sqlite/transactional", args: []string{"-crash-rate=0.03", "-stale-events=2"},
			check: func(t *testing.T, r exampleRun, _ string) { requireStaleAndOnce(t, r) }},
		{name: "gochannel/sqlite/lease", args: []string{"-store=sqlite", "-mode=lease"}},
		{name: "gochannel/memory/lease+crashes", args: []string{"-store=memory", "-crash-rate=0.03", "-lease=300ms"},
			check: func(t *testing.T, r exampleRun, _ string) {
				if r.count(t, "lease takeovers") == 0 {
					t.Errorf("crashes in lease mode but no takeover\n%s", r)
				}
			}},
		{name: "gochannel/redis/lease", args: []string{"-store=redis", "-crash-rate=0.02", "-lease=300ms"}, needs: rd,
			check: func(t *testing.T, _ exampleRun, runID string) { requireNoRedisKeys(t, runID) }},
		// Acked before the record is done: lost acks and republished
		// events meet records still completing, and wait for them.
		{name: "amqp/redis/lease+async-complete", args: []string{"-broker=amqp", "-store=redis", "-async-complete", "-crash-rate=0.02", "-lease=300ms"}, needs: both(mq, rd),
			check: func(t *testing.T, _ exampleRun, runID string) { requireNoRedisKeys(t, runID) }},
		{name: "gochannel/postgres/lease", args: []string{"-store=postgres", "-mode=lease"}, needs: pg, check: noTables(pg, "pgx")},
		{name: "gochannel/postgres/transactional", args: []string{"-store=postgres", "-mode=transactional", "-crash-rate=0.03"}, needs: pg, check: noTables(pg, "pgx")},
		{name: "gochannel/mysql/lease", args: []string{"-store=mysql", "-mode=lease"}, needs: my, check: noTables(my, "mysql")},
		{name: "gochannel/mysql/transactional", args: []string{"-store=mysql", "-mode=transactional"}, needs: my, check: noTables(my, "mysql")},
		{name: "kafka-embedded/sqlite", args: []string{"-broker=kafka-embedded"}},
		{name: "kafka-embedded/memory/lease", args: []string{"-broker=kafka-embedded", "-store=memory"}},
		// -broker=kafka against a cluster outside the example: the real one
		// of KAFKA_BROKERS, or else a kfake cluster this test runs, so the
		// reachability probe, topic creation and -cleanup (topics and
		// consumer group deleted) are exercised anyway.
		{name: "kafka/sqlite", args: []string{"-broker=kafka"}, needs: func(t *testing.T) []string {
			addrs := os.Getenv("KAFKA_BROKERS")
			if addrs == "" {
				cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cluster.Close)
				addrs = strings.Join(cluster.ListenAddrs(), ",")
			}
			return []string{"-kafka-brokers=" + addrs}
		}, check: func(t *testing.T, r exampleRun, runID string) {
			requireNoKafkaLeftovers(t, r, runID)
		}},
		{name: "amqp/sqlite", args: []string{"-broker=amqp"}, needs: mq,
			check: func(t *testing.T, _ exampleRun, runID string) { requireNoQueue(t, topicName(brokerAMQP, runID)) }},
		{name: "amqp/redis/lease", args: []string{"-broker=amqp", "-store=redis"}, needs: both(mq, rd)},
		// JetStream: its Nats-Msg-Id window drops the publisher's same-id
		// resends; the middleware catches the rest.
		{name: "nats/redis/lease", args: []string{"-broker=nats", "-store=redis"}, needs: both(nt, rd),
			check: func(t *testing.T, r exampleRun, runID string) {
				line := regexp.MustCompile(`(?m)^  broker dedup JetStream publish dedup .* dropped (\d+) of (\d+) same-id publish retries; it cannot catch redeliveries`).FindStringSubmatch(r.stdout)
				if line == nil || line[1] != line[2] || line[1] == "0" {
					t.Errorf("the summary does not show JetStream dropping every same-id resend\n%s", r)
				}
				if r.count(t, "duplicates dropped") == 0 {
					t.Errorf("the middleware dropped no duplicate: the broker's dedup cannot catch redeliveries\n%s", r)
				}
				requireNoRedisKeys(t, runID)
				requireNoNATSStreams(t, runID)
			}},
		// natsstore's KV bucket of the run, with the ledger in memory;
		// -cleanup deletes the bucket and the broker's streams.
		{name: "gochannel/nats/lease", args: []string{"-store=nats", "-crash-rate=0.02", "-lease=300ms"}, needs: nt,
			check: func(t *testing.T, r exampleRun, runID string) {
				if !strings.Contains(r.stdout, "mode lease") {
					t.Errorf("-mode=auto on the NATS store is not lease mode\n%s", r)
				}
				requireNoNATSStreams(t, runID)
			}},
		{name: "nats/nats/lease", args: []string{"-broker=nats", "-store=nats"}, needs: nt,
			check: func(t *testing.T, _ exampleRun, runID string) { requireNoNATSStreams(t, runID) }},
		{name: "redis-streams/redis/lease", args: []string{"-broker=redis-streams", "-store=redis"}, needs: rd,
			check: func(t *testing.T, _ exampleRun, runID string) {
				requireNoRedisKeys(t, runID)
				requireNoRedisStream(t, topicName(brokerRedisStreams, runID))
			}},
		// The SQL pub/subs with the inbox on the same database: the record
		// joins the subscriber's transaction.
		{name: "postgres/postgres/transactional", args: []string{"-broker=postgres", "-store=postgres"}, needs: pg, check: noTables(pg, "pgx")},
		{name: "mysql/mysql/transactional", args: []string{"-broker=mysql", "-store=mysql"}, needs: my, check: noTables(my, "mysql")},
		{name: "postgres/sqlite/transactional", args: []string{"-broker=postgres"}, needs: pg, check: noTables(pg, "pgx")},
		// -producer=foreign: the same events published with the broker's
		// own client, without Watermill's UUID header.
		{name: "kafka-embedded/memory/foreign", args: []string{"-broker=kafka-embedded", "-store=memory", "-producer=foreign", "-stale-events=2"},
			check: foreign("record:<Kafka record key>", nil)},
		{name: "amqp/sqlite/foreign", args: []string{"-broker=amqp", "-producer=foreign", "-stale-events=2"}, needs: mq,
			check: foreign("msg:<AMQP message_id, via amqpkeys.Marshaler>", func(t *testing.T, _ exampleRun, runID string) {
				requireNoQueue(t, topicName(brokerAMQP, runID))
			})},
		{name: "postgres/postgres/foreign", args: []string{"-broker=postgres", "-store=postgres", "-producer=foreign", "-stale-events=2"}, needs: pg,
			check: foreign("msg:<the row's uuid column>", noTables(pg, "pgx"))},
	}
	for _, c := range combos {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var extra []string
			if c.needs != nil {
				extra = c.needs(t)
			}
			runID := newTestRunID()
			r := runExample(t, runID, append(c.args, extra...)...)
			requireOK(t, r)
			if c.check != nil {
				c.check(t, r, runID)
			}
		})
	}
}

// Without the middleware the duplicates reach the ledger: the run must
// say so and exit 1.
func TestExampleWithoutDedupBreaksTheInvariant(t *testing.T) {
	t.Parallel()
	r := runExample(t, newTestRunID(), "-dedup=false", "-store=memory")
	if r.code != exitBroken || !strings.HasPrefix(r.invariant(), "invariant: BROKEN") {
		t.Fatalf("want exit 1 and a BROKEN invariant\n%s", r)
	}
	// Nothing claims without the middleware: the summary counts the
	// handler's runs, one effect each (#23: "claimed (handler ran) 0").
	if ran, applied := r.count(t, "handler ran"), r.count(t, "effects applied"); ran != applied || ran <= 202 {
		t.Errorf("handler ran %d, effects applied %d: want equal, above the 202 events\n%s", ran, applied, r)
	}
	if strings.Contains(r.stdout, "claimed") {
		t.Errorf("the summary shows claims without the middleware\n%s", r)
	}
	// On Redis nothing is written without the middleware: nothing is
	// said to be kept for inspection there (it named keys never written).
	// Without -cleanup, so that the run lists what it keeps.
	r = execExample(t, nil, "-run-id="+newTestRunID(), "-timeout=90s", "-dedup=false", "-store=redis", "-events=20", "-redis-addr="+testkit.RequireRedis(t))
	if strings.Contains(r.stdout+r.stderr, "delete Redis keys") {
		t.Errorf("a run without the middleware keeps Redis keys it never wrote\n%s", r)
	}
}

// A run id whose records a store still holds is refused before anything
// runs (#23): reused, its records made every message a duplicate of the
// earlier run's, and the summary reported "lost messages". Refused, the
// run deletes nothing, even under -cleanup: the records are that run's.
func TestExampleRefusesAUsedRunID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   func(t *testing.T) []string
		count  func(t *testing.T, runID string) int
		reason func(runID string) string // what the refusal names, when it is not the store's records
		again  []string                  // the second run's own flags
	}{
		{"redis", func(t *testing.T) []string {
			return []string{"-store=redis", "-redis-addr=" + testkit.RequireRedis(t)}
		}, func(t *testing.T, runID string) int {
			c := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
			t.Cleanup(func() {
				_ = redisclean.DeletePrefix(context.Background(), c, redisPrefix(runID))
				_ = c.Close()
			})
			keys, err := c.Keys(t.Context(), redisPrefix(runID)+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			return len(keys)
		}, nil, nil},
		{"sqlite", func(t *testing.T) []string { return []string{"-dir=" + t.TempDir()} }, nil, nil, nil},
		// A run without the middleware leaves no dedup record, but its
		// ledger entries would count as the next run's awards.
		{"sqlite ledger", func(t *testing.T) []string { return []string{"-dir=" + t.TempDir()} }, nil, nil, nil},
		{"nats", func(t *testing.T) []string {
			return []string{"-store=nats", "-nats-url=" + testkit.RequireNATS(t)}
		}, natsRunRecords, nil, nil},
		// natsstore refuses the bucket an earlier run made for a shorter
		// -retention before the records are looked at: the same refusal.
		{"nats, longer retention", func(t *testing.T) []string {
			return []string{"-store=nats", "-nats-url=" + testkit.RequireNATS(t)}
		}, natsRunRecords, func(runID string) string {
			return "bucket " + runName(storeNATS, runID) + ", made for another -lease or -retention"
		}, []string{"-retention=72h"}},
		// The brokers with a store that keeps nothing: the messages an
		// earlier run left in the run's stream. On JetStream this run's
		// messages, of the same ids (-seed), were dropped as duplicates
		// of those for 2 minutes: nothing was delivered, and the run
		// waited for -timeout to report every message unacked.
		{"nats broker", func(t *testing.T) []string {
			return []string{"-broker=nats", "-store=memory", "-nats-url=" + testkit.RequireNATS(t)}
		}, func(t *testing.T, runID string) int {
			js := natstest.JetStream(t, testkit.NATSURL())
			topic := topicName(brokerNATS, runID)
			t.Cleanup(func() {
				for _, s := range []string{natsStreamName(topic), natsStreamName(topic + ".poison")} {
					_ = js.DeleteStream(context.Background(), s)
				}
			})
			s, err := js.Stream(t.Context(), natsStreamName(topic))
			if err != nil {
				t.Fatalf("the run's stream: %v", err)
			}
			return int(s.CachedInfo().State.Msgs)
		}, func(runID string) string { return "JetStream stream " + natsStreamName(topicName(brokerNATS, runID)) }, nil},
		{"redis-streams broker", func(t *testing.T) []string {
			return []string{"-broker=redis-streams", "-store=memory", "-redis-addr=" + testkit.RequireRedis(t)}
		}, func(t *testing.T, runID string) int {
			c := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
			topic := topicName(brokerRedisStreams, runID)
			t.Cleanup(func() {
				_ = c.Del(context.Background(), topic, topic+".poison").Err()
				_ = c.Close()
			})
			n, err := c.XLen(t.Context(), topic).Result()
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}, func(runID string) string { return "Redis stream " + topicName(brokerRedisStreams, runID) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runID := newTestRunID()
			args := append([]string{"-events=20", "-timeout=90s", "-run-id=" + runID}, tc.args(t)...)
			first := args
			if tc.name == "sqlite ledger" {
				first = append(slices.Clip(args), "-dedup=false", "-republish-rate=0", "-fail-rate=0", "-lost-ack-rate=0")
			}
			requireOK(t, execExample(t, nil, first...)) // no -cleanup: its records stay
			var before int
			if tc.count != nil {
				if before = tc.count(t, runID); before == 0 {
					t.Fatalf("the first run left nothing under its run id %s", runID)
				}
			}
			// The refusal comes at once: a short -timeout fails a run
			// that waits for deliveries instead.
			r := execExample(t, nil, append(append(args, "-cleanup", "-timeout=20s"), tc.again...)...)
			if r.code != exitConfig {
				t.Fatalf("a run id used before: exit %d, want %d\n%s", r.code, exitConfig, r)
			}
			wants := []string{"-run-id " + runID + " was used before", "Choose another -run-id"}
			if tc.reason != nil {
				wants = append(wants, tc.reason(runID))
			}
			for _, want := range wants {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr lacks %q\n%s", want, r)
				}
			}
			if strings.Contains(r.stdout+r.stderr, "lost") || r.invariant() != "" {
				t.Errorf("a refused run reports lost messages or a verdict\n%s", r)
			}
			requireOnlyOwnLines(t, r)
			if tc.count != nil {
				if after := tc.count(t, runID); after != before {
					t.Errorf("the refused run changed what the earlier run left: %d, was %d", after, before)
				}
			}
		})
	}
}

// natsRunRecords counts the records (KV values) in the bucket of the run
// runID, and deletes the bucket when t ends.
func natsRunRecords(t *testing.T, runID string) int {
	js := natstest.JetStream(t, testkit.NATSURL())
	bucket := runName(storeNATS, runID)
	t.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), bucket) })
	kv, err := js.KeyValue(t.Context(), bucket)
	if err != nil {
		t.Fatalf("the run's bucket %s: %v", bucket, err)
	}
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return int(st.Values())
}

func TestExampleConfigErrors(t *testing.T) {
	t.Parallel()
	closed := testkit.ClosedAddr(t)
	for _, tc := range []struct {
		args []string
		want []string // in stderr
	}{
		{[]string{"-broker=pulsar"}, []string{`unknown broker "pulsar"`, "-broker"}},
		{[]string{"-store=etcd"}, []string{`unknown store "etcd"`, "-store"}},
		{[]string{"-producer=foreign"}, []string{"-producer=foreign", "gochannel has none", "-broker=kafka-embedded"}},
		// Refused before connecting (#23): the run connected to NATS, then
		// failed, and offered to delete streams it never created.
		{[]string{"-producer=foreign", "-broker=nats", "-nats-url=" + testkit.NATSURL()}, []string{"-producer=foreign is not available with -broker=nats"}},
		{[]string{"-producer=foreign", "-broker=redis-streams", "-redis-addr=" + testkit.RedisAddr()}, []string{"-producer=foreign is not available with -broker=redis-streams"}},
		{[]string{"-broker=amqp", "-amqp-url=amqp://guest:secret@" + closed + "/"}, []string{"RabbitMQ is not reachable at " + closed, "-amqp-url or AMQP_URL"}},
		{[]string{"-broker=kafka", "-kafka-brokers=" + closed}, []string{"Kafka is not reachable at " + closed, "-kafka-brokers or KAFKA_BROKERS"}},
		{[]string{"-store=redis", "-redis-addr=" + closed}, []string{"Redis is not reachable at " + closed, "-redis-addr or REDIS_ADDR"}},
		{[]string{"-store=postgres", "-postgres-dsn=postgres://postgres@" + closed + "/test"}, []string{"PostgreSQL is not reachable at " + closed, "-postgres-dsn or POSTGRES_DSN"}},
		{[]string{"-store=mysql", "-mysql-dsn=root@tcp(" + closed + ")/test"}, []string{"MySQL/MariaDB is not reachable at " + closed, "-mysql-dsn or MYSQL_DSN"}},
		{[]string{"-retention=1h", "-strict-retention"}, []string{"too short", "-retention", "(-strict-retention)"}},
		{[]string{"-lease=5"}, []string{"-lease", "a duration needs a unit, such as 5s"}},
	} {
		r := runExample(t, newTestRunID(), tc.args...)
		if !refusedSaying(t, r, tc.want) {
			continue
		}
		if strings.Contains(r.stderr, "secret") || strings.Contains(r.stderr, "panic") {
			t.Errorf("%v: stderr shows a password or a panic\n%s", tc.args, r)
		}
		if strings.Contains(r.stderr, "kept for inspection") {
			t.Errorf("%v: a run that created nothing says it kept something\n%s", tc.args, r)
		}
		requireOnlyOwnLines(t, r)
	}
}

// requireStaleAndOnce checks a run of 200 events with -stale-events=2
// and faults: the stale events were ttl misses, the faults made
// duplicates and redeliveries, and each of the 202 effects was applied
// exactly once.
func requireStaleAndOnce(t *testing.T, r exampleRun) {
	t.Helper()
	if got := r.count(t, "ttl misses"); got < 2 {
		t.Errorf("ttl misses = %d, want at least the 2 stale events\n%s", got, r)
	}
	if r.count(t, "duplicates dropped") == 0 || r.count(t, "redelivered") == 0 {
		t.Errorf("no duplicates or redeliveries: the scenario injected nothing\n%s", r)
	}
	if got := r.count(t, "effects applied"); got != 202 {
		t.Errorf("effects applied = %d, want 202 (exactly once)\n%s", got, r)
	}
}

// refusedSaying reports whether r is a refusal at start (exitConfig) whose
// stderr says each of want, failing t where it is not.
func refusedSaying(t *testing.T, r exampleRun, want []string) bool {
	t.Helper()
	if r.code != exitConfig {
		t.Errorf("%v: exit %d, want %d\n%s", r.args, r.code, exitConfig, r)
		return false
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("%v: stderr lacks %q\n%s", r.args, w, r)
		}
	}
	return true
}

// requireOnlyOwnLines checks that a failed start printed its error and
// nothing else: no client library's log lines, no usage text.
func requireOnlyOwnLines(t *testing.T, r exampleRun) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if !strings.HasPrefix(l, "router_example: ") {
			t.Errorf("%v: stderr line %q is not the example's\n%s", r.args, l, r)
		}
	}
}

// A server that answers and refuses (a wrong password, an unknown role,
// database or virtual host) is not "not reachable": the error says it
// refused, and what it said.
func TestExampleServiceRefuses(t *testing.T) {
	t.Parallel()
	pgURL, err := url.Parse(testkit.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	pgRole, pgDB := *pgURL, *pgURL
	pgRole.User = url.User("nosuchrole")
	pgDB.Path = "/nosuchdb"
	pg := pgRole.String()
	my, err := mysql.ParseDSN(testkit.RequireMySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	myPass, myDB := my.Clone(), my.Clone()
	myPass.Passwd = "wrong-secret"
	myDB.DBName = "nosuchdb"
	mq, err := url.Parse(testkit.RequireAMQP(t))
	if err != nil {
		t.Fatal(err)
	}
	mqPass, mqHost := *mq, *mq
	mqPass.User = url.UserPassword(mq.User.Username(), "wrong-secret")
	mqHost.Path = "/nosuchvhost"
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-store=postgres", "-postgres-dsn=" + pg}, []string{"PostgreSQL at ", "refused the connection", `role "nosuchrole" does not exist`}},
		{[]string{"-store=postgres", "-postgres-dsn=" + pgDB.String()}, []string{"PostgreSQL at ", "refused the connection", `database "nosuchdb" does not exist`}},
		{[]string{"-store=mysql", "-mysql-dsn=" + myPass.FormatDSN()}, []string{"MySQL/MariaDB at ", "refused the connection", "Access denied"}},
		{[]string{"-store=mysql", "-mysql-dsn=" + myDB.FormatDSN()}, []string{"MySQL/MariaDB at ", "refused the connection", "nosuchdb"}},
		{[]string{"-broker=amqp", "-amqp-url=" + mqPass.String()}, []string{"RabbitMQ at ", "refused the connection", "403"}},
		{[]string{"-broker=amqp", "-amqp-url=" + mqHost.String()}, []string{"RabbitMQ at ", "refused the connection", "nosuchvhost"}},
	} {
		r := runExample(t, newTestRunID(), tc.args...)
		if !refusedSaying(t, r, tc.want) {
			continue
		}
		if strings.Contains(r.stderr, "not reachable") || strings.Contains(r.stderr, "wrong-secret") {
			t.Errorf("%v: says not reachable, or shows the password\n%s", tc.args, r)
		}
		requireOnlyOwnLines(t, r)
	}
}

// A loud warning, not a failure, without -strict-retention.
func TestExampleRetentionWarning(t *testing.T) {
	t.Parallel()
	r := runExample(t, newTestRunID(), "-retention=1h", "-store=memory", "-events=20")
	requireOK(t, r)
	if !strings.Contains(r.stderr, "WARNING: the dedup window is too short") || !strings.Contains(r.stdout, "retention  TOO SHORT") {
		t.Fatalf("no retention warning\n%s", r)
	}
	// Once: the middleware no longer logs it itself.
	if n := strings.Count(r.stderr, "too short"); n != 1 {
		t.Fatalf("the retention warning is printed %d times, want once\n%s", n, r)
	}
}

// The YAML file and the environment configure the binary too.
func TestExampleConfigFileAndEnv(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "example.yml", "broker: kafka-embedded\nstore: memory\nevents: 50\ncustomers: 9\n")
	r := runExampleEnv(t, newTestRunID(), []string{"DEDUP_CUSTOMERS=3"}, "-config="+file, "-events=40")
	requireOK(t, r)
	if !strings.Contains(r.stdout, " 3 customers") {
		t.Fatalf("DEDUP_CUSTOMERS=3 did not win over the file's customers: 9\n%s", r)
	}
	if !strings.Contains(r.stdout, "broker     kafka-embedded") || !strings.Contains(r.stdout, "store      memory") {
		t.Fatalf("the file's broker and store were not used\n%s", r)
	}
	if got := r.count(t, "events (distinct payments)"); got != 40 {
		t.Fatalf("events = %d, want 40 (the flag wins over the file)", got)
	}
}

// -metrics-addr serves the adapter's metrics; -linger keeps them up after
// the summary until interrupted.
func TestExampleMetricsEndpoint(t *testing.T) {
	t.Parallel()
	bin := buildExample(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-events=100", "-store=memory", "-crash-rate=0.05", "-lease=300ms",
		"-stale-events=1", "-metrics-addr=127.0.0.1:0", "-linger=2m", "-run-id="+newTestRunID())
	cmd.Env = exampleEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	var stderrBuf strings.Builder
	var mu sync.Mutex
	go func() {
		re := regexp.MustCompile(`serving metrics at (http://\S+/metrics)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			stderrBuf.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrCh <- m[1]
			}
		}
	}()
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "invariant: ") {
			break
		}
	}
	if !strings.Contains(out.String(), "invariant: OK") {
		t.Fatalf("no OK invariant:\n%s", out.String())
	}
	var url string
	select {
	case url = <-addrCh:
	case <-ctx.Done():
		t.Fatal("the example never said where it serves metrics")
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`dedup_outcomes_total{outcome="claimed",scope="loyalty"}`,
		`dedup_outcomes_total{outcome="duplicate",scope="loyalty"}`,
		`dedup_outcomes_total{outcome="takeover",scope="loyalty"}`,
		`dedup_outcomes_total{outcome="bypassed",scope="loyalty"} 0`,
		`dedup_store_duration_seconds_bucket{op="claim",result="ok",scope="loyalty",le=`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The stale event was claimed at least once (again after a failure).
	if !regexp.MustCompile(`dedup_outcomes_total\{outcome="ttl_miss",scope="loyalty"\} [1-9]`).Match(body) {
		t.Errorf("/metrics shows no ttl_miss for the stale event")
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		t.Fatalf("after Ctrl-C during -linger: %v (want exit 0)\n%s", err, stderrBuf.String())
	}
}

// requireNoTables checks -cleanup dropped every table of the run.
func requireNoTables(t *testing.T, driver, dsn, runID string) {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?"
	if driver == "pgx" {
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1"
	}
	rows, err := db.QueryContext(t.Context(), q, "%"+runID+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		left = append(left, n)
	}
	if len(left) > 0 {
		t.Fatalf("-cleanup left tables %v", left)
	}
}

// requireNoKafkaLeftovers checks -cleanup deleted the run's topics and
// consumer group.
func requireNoKafkaLeftovers(t *testing.T, r exampleRun, runID string) {
	t.Helper()
	var brokers string
	for _, a := range r.args {
		if v, ok := strings.CutPrefix(a, "-kafka-brokers="); ok {
			brokers = v
		}
	}
	admin, err := sarama.NewClusterAdmin(cliflag.SplitList(brokers), kafkaConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	for name := range topics {
		if strings.Contains(name, runID) {
			t.Errorf("-cleanup left Kafka topic %s", name)
		}
	}
	groups, err := admin.ListConsumerGroups()
	if err != nil {
		t.Fatal(err)
	}
	for name := range groups {
		if strings.Contains(name, runID) {
			t.Errorf("-cleanup left Kafka consumer group %s", name)
		}
	}
}

func requireNoRedisKeys(t *testing.T, runID string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
	defer c.Close()
	iter := c.Scan(t.Context(), 0, redisPrefix(runID)+"*", 1000).Iterator()
	for iter.Next(t.Context()) {
		t.Fatalf("-cleanup left Redis key %s", iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
}

// requireNoNATSStreams fails when -cleanup left a stream of the run.
func requireNoNATSStreams(t *testing.T, runID string) {
	t.Helper()
	js := natstest.JetStream(t, testkit.NATSURL())
	names := js.StreamNames(t.Context())
	for name := range names.Name() {
		if strings.Contains(name, runID) {
			t.Errorf("-cleanup left JetStream stream %s", name)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

// requireNoRedisStream fails when -cleanup left the stream key.
func requireNoRedisStream(t *testing.T, key string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testkit.RedisAddr()})
	defer c.Close()
	if n, err := c.Exists(t.Context(), key, key+".poison").Result(); err != nil || n != 0 {
		t.Errorf("-cleanup left the Redis stream %s (exists=%d, %v)", key, n, err)
	}
}

func requireNoQueue(t *testing.T, queue string) {
	t.Helper()
	ch := amqptest.AMQPChannel(t, testkit.AMQPURL())
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		t.Fatalf("-cleanup left RabbitMQ queue %s", queue)
	}
}

// A -postgres-dsn that points at another service (MySQL/MariaDB's port)
// says a server answered there, but not with the PostgreSQL protocol; it
// said pgx's "received unexpected message: %!w(<nil>)".
func TestExamplePostgresDSNAtAnotherService(t *testing.T) {
	t.Parallel()
	addr := anystore.RequireStore(t, anystore.StoreMySQL)
	r := runExample(t, newTestRunID(), "-store=postgres", "-postgres-dsn=postgres://postgres@"+addr+"/test?sslmode=disable", "-events=5")
	if r.code != exitConfig {
		t.Fatalf("exit %d, want %d\n%s", r.code, exitConfig, r)
	}
	for _, w := range []string{"no PostgreSQL at " + addr + "/test", "-postgres-dsn or POSTGRES_DSN", "not with the PostgreSQL protocol"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q\n%s", w, r)
		}
	}
	if strings.Contains(r.stderr, "%!") {
		t.Errorf("stderr shows a badly formatted error\n%s", r)
	}
	requireOnlyOwnLines(t, r)
}

// A rediss:// URL to a Redis without TLS says the server did not complete
// a TLS handshake, and maybe does not speak TLS, in the example's lines
// only: it printed "no answer within 3s", often after a line of
// go-redis's own pool logger.
func TestExampleRedisTLSToPlaintext(t *testing.T) {
	t.Parallel()
	addr := testkit.RequireRedis(t)
	r := runExample(t, newTestRunID(), "-store=redis", "-redis-addr=rediss://"+addr, "-events=5")
	if r.code != exitConfig {
		t.Fatalf("exit %d, want %d\n%s", r.code, exitConfig, r)
	}
	for _, w := range []string{"rediss://" + addr, "did not complete a TLS handshake", "does not speak TLS", "redis://"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q\n%s", w, r)
		}
	}
	requireOnlyOwnLines(t, r)
}
