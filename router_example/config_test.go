package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker != brokerGoChannel || cfg.Store != storeSQLite || cfg.mode() != dedup.ModeTransactional {
		t.Fatalf("defaults: broker %s, store %s, mode %s; want gochannel, sqlite, transactional", cfg.Broker, cfg.Store, cfg.mode())
	}
	if !cfg.retentionCheck().ok() {
		t.Fatalf("the default retention fails its own check: %s", cfg.retentionCheck())
	}
}

// -mode takes dedup.ParseMode's names or auto; -async-complete turns
// lease into async-complete.
func TestConfigMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want dedup.Mode
	}{
		{[]string{"-store=memory"}, dedup.ModeLease},
		{[]string{"-store=memory", "-async-complete"}, dedup.ModeAsyncComplete},
		{[]string{"-mode=async-complete"}, dedup.ModeAsyncComplete},
		{[]string{"-mode=lease"}, dedup.ModeLease},
		{[]string{"-mode=transactional", "-store=postgres"}, dedup.ModeTransactional},
		{[]string{"-mode=Lease", "-async-complete"}, dedup.ModeAsyncComplete},
	} {
		cfg, err := loadConfig(tc.args, env(nil), io.Discard)
		if err != nil || cfg.mode() != tc.want {
			t.Errorf("%v: mode %v, %v; want %v", tc.args, cfg.mode(), err, tc.want)
		}
	}
	if _, err := loadConfig([]string{"-mode=exactly-once"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "async-complete") {
		t.Errorf("-mode=exactly-once: %v, want the modes listed", err)
	}
}

// Flags win over the environment, which wins over the file, which wins
// over the defaults.
func TestConfigPrecedence(t *testing.T) {
	file := writeFile(t, "c.yml", `
broker: amqp
producer: foreign
store: redis
events: 10
customers: 7
kafka-brokers: [a:9092, b:9092]
lease: 2s
cleanup: true
`)
	e := map[string]string{"DEDUP_EVENTS": "20", "DEDUP_STORE": "memory", "REDIS_ADDR": "r:1"}
	cfg, err := loadConfig([]string{"-config", file, "-events", "30"}, env(e), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"events (flag > env > file)", cfg.Events, 30},
		{"store (env > file)", cfg.Store, storeMemory},
		{"broker (file)", cfg.Broker, brokerAMQP},
		{"producer (file)", cfg.Producer, producerForeign},
		{"customers (file)", cfg.Customers, 7},
		{"kafka-brokers (file list)", cfg.KafkaBrokers, "a:9092,b:9092"},
		{"lease (file duration)", cfg.Lease, 2 * time.Second},
		{"cleanup (file bool)", cfg.Cleanup, true},
		{"redis-addr (REDIS_ADDR)", cfg.RedisAddr, "r:1"},
		{"config", cfg.ConfigFile, file},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}

	// DEDUP_CONFIG names the file when -config does not.
	cfg, err = loadConfig(nil, env(map[string]string{"DEDUP_CONFIG": file}), io.Discard)
	if err != nil || cfg.Broker != brokerAMQP {
		t.Fatalf("DEDUP_CONFIG: broker %q, err %v", cfg.Broker, err)
	}
}

func TestConfigErrors(t *testing.T) {
	badYAML := writeFile(t, "bad.yml", "brokr: kafka\n")
	listOfMaps := writeFile(t, "maps.yml", "kafka-brokers:\n  - {a: 1}\n")
	notMapping := writeFile(t, "list.yml", "- broker\n")
	leaseNoUnit := writeFile(t, "lease.yml", "lease: 5\n")
	twice := writeFile(t, "twice.yml", "store: memory\nevents: 10\nstore: redis\n")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // in the error
	}{
		{[]string{"-broker", "pulsar"}, nil, "set -broker (or DEDUP_BROKER)"},
		{nil, map[string]string{"DEDUP_STORE": "etcd"}, "set -store (or DEDUP_STORE)"},
		{[]string{"-mode", "magic"}, nil, "-mode"},
		{[]string{"-producer", "kafka"}, nil, "set -producer (or DEDUP_PRODUCER) to one of watermill, foreign"},
		{[]string{"-producer", "foreign"}, nil, "gochannel has none"},
		{nil, map[string]string{"DEDUP_PRODUCER": "foreign"}, "gochannel has none"},
		// Caught before anything connects (#23): nats and redis-streams
		// have no foreign producer in the example.
		{[]string{"-producer", "foreign", "-broker", "nats"}, nil, "-producer=foreign is not available with -broker=nats"},
		{[]string{"-producer", "foreign", "-broker", "redis-streams"}, nil, "-producer=foreign is not available with -broker=redis-streams"},
		{[]string{"-store", "redis", "-mode", "transactional"}, nil, "needs a SQL store"},
		{[]string{"-run-id", "Bad-Id"}, nil, "-run-id"},
		{[]string{"-events", "0"}, nil, "-events"},
		{[]string{"-fail-rate", "1.5"}, nil, "-fail-rate"},
		{[]string{"-lease", "1ms"}, nil, "-lease"},
		{[]string{"-stale-events", "5", "-events", "2"}, nil, "-stale-events"},
		{[]string{"-on-store-error", "panic"}, nil, "-on-store-error"},
		{[]string{"-on-store-error", "fail-open"}, nil, "cannot be combined with transactional"},
		{[]string{"-async-complete"}, nil, "-async-complete cannot be combined with transactional"},
		{[]string{"-linger", "1s"}, nil, "-metrics-addr"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"DEDUP_EVENTS": "many"}, "DEDUP_EVENTS"},
		{[]string{"-config", badYAML}, nil, `unknown key "brokr"`},
		{[]string{"-config", listOfMaps}, nil, "plain values"},
		{[]string{"-config", notMapping}, nil, "want a mapping"},
		{[]string{"-lease", "5"}, nil, "a duration needs a unit, such as 5s"},
		{[]string{"-timeout", "soon"}, nil, "not a duration: write a number and a unit"},
		{nil, map[string]string{"DEDUP_LEASE": "2"}, "a duration needs a unit"},
		{[]string{"-config", leaseNoUnit}, nil, "line 1: key lease: a duration needs a unit, such as 5s"},
		{[]string{"-config", twice}, nil, "line 3: key store is given twice (first on line 1)"},
		{[]string{"-config", filepath.Join(t.TempDir(), "missing.yml")}, nil, "config file (-config)"},
	} {
		_, err := loadConfig(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("args %q env %v: got error %v, want one containing %q", tc.args, tc.env, err, tc.want)
		}
	}
	if _, err := loadConfig([]string{"-help"}, env(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-help: got %v, want flag.ErrHelp", err)
	}
}

func TestUsageNamesEnvVars(t *testing.T) {
	var b strings.Builder
	_, _ = loadConfig([]string{"-help"}, env(nil), &b)
	for _, want := range []string{"[env DEDUP_BROKER]", "[env KAFKA_BROKERS]", "[env POSTGRES_DSN]", "Exit status"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, b.String())
		}
	}
}

// -help prints each default once, as the flag package does: a string
// quoted once (#23: the printer quoted f.DefValue in place, and the usage
// runs twice, so every string default came out quoted twice).
func TestUsageDefaults(t *testing.T) {
	var b strings.Builder
	if _, err := loadConfig([]string{"-help"}, env(nil), &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-help: %v", err)
	}
	out := b.String()
	if n := strings.Count(out, "Usage:"); n != 1 {
		t.Errorf("the usage is printed %d times, want once:\n%s", n, out)
	}
	for _, want := range []string{`(default "gochannel")`, `(default "amqp://guest:guest@127.0.0.1:5672/")`, `(default 1000)`, `(default true)`, "(default 1s)", `(default "fail-closed")`} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %s", want)
		}
	}
	if strings.Contains(out, `\"`) {
		t.Errorf("usage shows a default quoted twice:\n%s", out)
	}
	// And again: the flag set keeps no state between prints.
	var again strings.Builder
	_, _ = loadConfig([]string{"-h"}, env(nil), &again)
	if again.String() != out {
		t.Errorf("a second -help prints differently:\n%s", again.String())
	}
}

func TestRedeliveryHorizon(t *testing.T) {
	base := defaultConfig()
	for _, tc := range []struct {
		mod    func(*Config)
		want   time.Duration
		source string
	}{
		{func(c *Config) { c.Broker = brokerKafka }, 15 * time.Minute, "-kafka-group-recovery"},
		{func(c *Config) { c.Broker = brokerKafkaEmbedded; c.KafkaGroupRecovery = time.Hour }, time.Hour, "-kafka-group-recovery"},
		{func(c *Config) { c.Broker = brokerAMQP }, 24 * time.Hour, "RabbitMQ consumer-outage budget"},
		{func(c *Config) { c.Broker = brokerNATS }, 24 * time.Hour, "NATS JetStream consumer-outage budget"},
		{func(c *Config) { c.Broker = brokerNATS; c.OutageBudget = 30 * 24 * time.Hour }, natsMaxAge, "within the stream's MaxAge"},
		{func(c *Config) { c.Broker = brokerRedisStreams }, 24*time.Hour + redisClaimIdle, "Redis Streams consumer-outage budget"},
		{func(c *Config) { c.Broker = brokerPostgres; c.OutageBudget = 2 * time.Hour }, 2 * time.Hour, "-outage-budget"},
		{func(c *Config) { c.Broker = brokerKafka; c.RedeliveryHorizon = 3 * time.Hour }, 3 * time.Hour, "-redelivery-horizon"},
	} {
		c := base
		tc.mod(&c)
		h := c.redeliveryHorizon()
		if h.d != tc.want || !strings.Contains(h.source, tc.source) {
			t.Errorf("%+v: got %s (%s), want %s (%s)", c.Broker, h.d, h.source, tc.want, tc.source)
		}
	}

	c := base
	c.Retention, c.RedeliveryHorizon = time.Hour, time.Hour
	rc := c.retentionCheck()
	if rc.ok() || rc.minimum != 78*time.Minute || !strings.HasPrefix(rc.String(), "TOO SHORT") {
		t.Errorf("1h retention for a 1h horizon: ok=%v minimum=%s %q", rc.ok(), rc.minimum, rc)
	}
	c.Retention = 78 * time.Minute
	if rc := c.retentionCheck(); !rc.ok() || !strings.HasPrefix(rc.String(), "OK") {
		t.Errorf("retention of exactly 1.3 x the horizon: %q", rc)
	}
}

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// Every `go run ./router_example ...` line of the READMEs (and of main.go's
// doc comment) is a valid configuration, and the YAML sample loads: the
// docs cannot drift from the flags.
func TestReadmeCommandsParse(t *testing.T) {
	cmds := documentedCommands(t)
	for _, c := range cmds {
		cfg, err := loadConfig(c.Args, env(nil), io.Discard)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %q: %v", c.Where, c.Line, err)
		}
		if w := cfg.warnings(); len(w) > 0 {
			t.Errorf("%s: %q: warns %q", c.Where, c.Line, w)
		}
	}
	if len(cmds) < 12 {
		t.Fatalf("found %d go run ./router_example commands in the READMEs; the broker and store lists are missing", len(cmds))
	}
	for _, path := range []string{"../README.md", "README.md"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range yamlBlock.FindAllStringSubmatch(string(data), -1) {
			file := writeFile(t, "readme.yml", block[1])
			if _, err := loadConfig([]string{"-config", file}, env(nil), io.Discard); err != nil {
				t.Errorf("%s: the YAML sample does not load: %v", path, err)
			}
		}
	}
}

// A flag the chosen broker, store or mode ignores is warned about when it
// was given on the command line or in the file; the environment is not
// checked (a shell's REDIS_ADDR may be meant for other programs).
func TestConfigWarnings(t *testing.T) {
	file := writeFile(t, "c.yml", "store: memory\ndir: ./data\n")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"-store=memory", "-dir=x"}, nil, []string{"-dir is ignored without -store=sqlite"}},
		{[]string{"-redis-addr=r:1"}, nil, []string{"-redis-addr is ignored without -store=redis"}},
		{[]string{"-store=memory", "-dedup=false", "-async-complete"}, nil, []string{"-async-complete is ignored with -dedup=false"}},
		{[]string{"-lease=2s"}, nil, []string{"-lease is ignored in transactional mode"}},
		{[]string{"-broker=kafka-embedded", "-kafka-brokers=k:9092", "-outage-budget=1h"}, nil, []string{"-kafka-brokers is ignored without -broker=kafka", "-outage-budget is ignored with Kafka"}},
		{[]string{"-amqp-url=amqp://x/"}, nil, []string{"-amqp-url is ignored without -broker=amqp"}},
		{[]string{"-config=" + file}, nil, []string{"-dir is ignored without -store=sqlite"}},
		{nil, map[string]string{"REDIS_ADDR": "r:1", "DEDUP_DIR": "x", "DEDUP_STORE": "memory"}, nil},
		{[]string{"-store=redis", "-redis-addr=r:1", "-lease=2s", "-mode=lease"}, nil, nil},
		{[]string{"-broker=postgres", "-store=sqlite", "-postgres-dsn=postgres://x/y", "-dir=d"}, nil, nil},
	} {
		cfg, err := loadConfig(tc.args, env(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		got := cfg.warnings()
		if len(got) != len(tc.want) {
			t.Errorf("args %q env %v: warnings %q, want %q", tc.args, tc.env, got, tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w) {
				t.Errorf("args %q: warning %q, want %q", tc.args, got[i], w)
			}
		}
	}
}

// A setting whose value came from the -config file is named with the
// file: the flag and variable the error names are not where it is.
func TestErrorNamesTheConfigFileASettingCameFrom(t *testing.T) {
	closed := testkit.ClosedAddr(t)
	file := writeFile(t, "example.yaml", "store: redis\nredis-addr: "+closed+"\n")
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		inFile bool
	}{
		{"from the file", []string{"-config=" + file}, nil, true},
		{"on the command line", []string{"-config=" + file, "-redis-addr=" + closed}, nil, false},
		{"from the environment", []string{"-config=" + file}, map[string]string{"REDIS_ADDR": closed}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(t.Context(), append(tc.args, "-events=1"), &stdout, &stderr, env(tc.env))
			if code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s", code, exitConfig, stderr.String())
			}
			want := "(the value comes from key redis-addr of " + file + ")"
			if got := strings.Contains(stderr.String(), want); got != tc.inFile {
				t.Fatalf("stderr names the file: %v, want %v\n%s", got, tc.inFile, stderr.String())
			}
			if !strings.Contains(stderr.String(), "-redis-addr or REDIS_ADDR") {
				t.Fatalf("stderr does not name the flag and variable\n%s", stderr.String())
			}
		})
	}
}

// A value from the -config file that Validate refuses names the file too.
func TestInvalidValueNamesTheConfigFile(t *testing.T) {
	for _, tc := range []struct{ yaml, key string }{
		{"store: bogus\n", "store"},
		{"events: -3\n", "events"},
		{"run-id: ABC\n", "run-id"},
		{"fail-rate: 2\n", "fail-rate"},
	} {
		file := writeFile(t, "example.yaml", tc.yaml)
		var stdout, stderr strings.Builder
		if code := run(t.Context(), []string{"-config=" + file}, &stdout, &stderr, env(nil)); code != exitConfig {
			t.Fatalf("%q: exit %d, want %d\n%s", tc.yaml, code, exitConfig, stderr.String())
		}
		if want := "(the value comes from key " + tc.key + " of " + file + ")"; !strings.Contains(stderr.String(), want) {
			t.Errorf("%q: stderr lacks %q\n%s", tc.yaml, want, stderr.String())
		}
	}
	// The same value on the command line names no file.
	var stdout, stderr strings.Builder
	file := writeFile(t, "example.yaml", "events: 5\n")
	if code := run(t.Context(), []string{"-config=" + file, "-events=-3"}, &stdout, &stderr, env(nil)); code != exitConfig || strings.Contains(stderr.String(), "comes from") {
		t.Errorf("exit %d; a flag's own value is said to come from the file\n%s", code, stderr.String())
	}
}
