package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/internal/readmetest"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// documentedCommands finds every `go run ./router_example ...` command
// the READMEs and main.go's doc comment show, once each.
func documentedCommands(t *testing.T) []readmetest.Command {
	return readmetest.Commands(t, "./router_example", "../README.md", "README.md", "main.go")
}

// kafkaForDocs is the cluster the documented -broker=kafka commands run
// against: KAFKA_BROKERS, or else one in-process kfake cluster for the
// whole test.
var kafkaForDocs struct {
	once  sync.Once
	addrs string
	err   error
}

func docsKafka(t *testing.T) string {
	t.Helper()
	if a := os.Getenv("KAFKA_BROKERS"); a != "" {
		return a
	}
	kafkaForDocs.once.Do(func() {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			kafkaForDocs.err = err
			return
		}
		kafkaForDocs.addrs = strings.Join(c.ListenAddrs(), ",")
		// Closed when the test binary exits: the commands' tests run in
		// parallel and end in any order.
	})
	if kafkaForDocs.err != nil {
		t.Fatal(kafkaForDocs.err)
	}
	return kafkaForDocs.addrs
}

// serviceFlags checks the services a command needs and points it at the
// test's addresses, which win over the documented ones (the same defaults,
// unless the environment moves them).
func serviceFlags(t *testing.T, args []string) []string {
	t.Helper()
	cfg, err := loadConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		return nil // -help; a bad command fails TestReadmeCommandsParse
	}
	uses := func(name string) bool { return cfg.Broker == name || cfg.Store == name }
	var out []string
	if cfg.Broker == brokerKafka {
		out = append(out, "-kafka-brokers="+docsKafka(t))
	}
	if uses(brokerAMQP) {
		out = append(out, "-amqp-url="+testkit.RequireAMQP(t))
	}
	if cfg.Broker == brokerNATS || cfg.Store == storeNATS {
		out = append(out, "-nats-url="+testkit.RequireNATS(t))
	}
	if uses(storeRedis) || cfg.Broker == brokerRedisStreams {
		out = append(out, "-redis-addr="+testkit.RequireRedis(t))
	}
	if uses(storePostgres) {
		out = append(out, "-postgres-dsn="+testkit.RequirePostgres(t))
	}
	if uses(storeMySQL) {
		out = append(out, "-mysql-dsn="+testkit.RequireMySQL(t))
	}
	return out
}

// documentedTimeout is the -timeout the documented commands run with in
// the tests: their default (2m) is a budget for an idle machine, which a
// loaded CI machine running every command at once under the race
// detector can exceed without anything being wrong. What they must show
// is the invariant held, however long that takes.
const documentedTimeout = 20 * time.Minute

// runDocumented runs the binary with args as they are documented (the
// default events), plus -cleanup, a unique run id and -timeout
// documentedTimeout.
func runDocumented(t *testing.T, args []string) exampleRun {
	t.Helper()
	args = append(append([]string{"-cleanup", "-run-id=" + newTestRunID()}, args...), serviceFlags(t, args)...)
	args = append(args, "-timeout="+documentedTimeout.String())
	ctx, cancel := context.WithTimeout(t.Context(), documentedTimeout+2*time.Minute)
	defer cancel()
	return runBinary(ctx, t, t.TempDir(), exampleEnv(), args) // -dir=./loyalty and the like land in the test's directory
}

// Every command the docs show runs, exactly as written (but for -cleanup,
// a run id, the services' addresses and a -timeout no loaded machine
// reaches, documentedTimeout), holds the invariant, and warns about
// nothing: a documented command must pass every time. Among them the lease-mode crash demo on RabbitMQ, whose
// takeovers cost one lease each, one after another.
func TestReadmeCommandsRun(t *testing.T) {
	buildExample(t)
	cmds := documentedCommands(t)
	crashDemo := false
	for _, c := range cmds {
		crashDemo = crashDemo || strings.Join(c.Args, " ") == "-broker=amqp -store=redis -crash-rate=0.02"
		name := strings.Join(c.Args, " ")
		if name == "" {
			name = "no flags"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runDocumented(t, c.Args)
			if len(c.Args) == 1 && c.Args[0] == "-help" {
				if r.code != exitOK || !strings.Contains(r.stderr, "Usage: go run ./router_example") {
					t.Fatalf("%s: %s: want the usage and exit 0\n%s", c.Where, c.Line, r)
				}
				return
			}
			requireOK(t, r)
			if strings.Contains(r.stderr, "WARNING") {
				t.Errorf("%s: %s: a documented command warns\n%s", c.Where, c.Line, r)
			}
		})
	}
	if !crashDemo {
		t.Error("the READMEs no longer show the crash demo -broker=amqp -store=redis -crash-rate=0.02")
	}
	// The YAML sample, with the metrics on any free port.
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range yamlBlock.FindAllStringSubmatch(string(data), -1) {
		t.Run("yaml sample", func(t *testing.T) {
			t.Parallel()
			file := writeFile(t, "loyalty.yml", block[1])
			cfg, err := loadConfig([]string{"-config=" + file}, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"-config=" + file, "-metrics-addr=127.0.0.1:0"}
			if cfg.Broker == brokerKafka {
				args = append(args, "-kafka-brokers="+docsKafka(t))
			}
			if cfg.Store == storePostgres {
				args = append(args, "-postgres-dsn="+testkit.RequirePostgres(t))
			}
			requireOK(t, runDocumented(t, args))
		})
	}
}

// -seed alone reproduces a run: two runs under different run ids inject
// the same faults into the same messages.
func TestExampleSeedReproducesARun(t *testing.T) {
	t.Parallel()
	args := []string{"-store=memory", "-seed=7", "-crash-rate=0.03", "-lease=300ms"}
	a, b := runExample(t, newTestRunID(), args...), runExample(t, newTestRunID(), args...)
	requireOK(t, a)
	requireOK(t, b)
	row := regexp.MustCompile(`(?m)^  (redelivered|retried in process|published messages|expected) .*$`)
	ra, rb := row.FindAllString(a.stdout, -1), row.FindAllString(b.stdout, -1)
	// The redelivered count itself may differ (a republished event's
	// duplicate meets its original in progress, or not); the injections
	// may not.
	note := regexp.MustCompile(`\d+ lost acks, \d+ crashes`)
	failures := regexp.MustCompile(`\d+ injected failures;`)
	if len(ra) != 4 || note.FindString(ra[1]) != note.FindString(rb[1]) || failures.FindString(ra[2]) != failures.FindString(rb[2]) ||
		ra[0] != rb[0] || ra[3] != rb[3] {
		t.Fatalf("same seed, other run id, other run:\n%s\n%s\n%s\n%s", strings.Join(ra, "\n"), strings.Join(rb, "\n"), a, b)
	}
}

// The root README's sample summary is what `go run ./router_example`
// prints: a run with the defaults (seed 1) gives the same rows for what
// the seed decides (events, messages, injected faults, retries, effects,
// points); deliveries, timings and names vary.
func TestReadmeSampleSummary(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(readme), "    router_example: payments -> loyalty, run ")
	if start < 0 {
		t.Fatal("README.md has no sample summary")
	}
	sample := string(readme[start:])
	sample = sample[:strings.Index(sample, "    invariant: ")+len(strings.SplitN(sample[strings.Index(sample, "    invariant: "):], "\n", 2)[0])]
	decided := regexp.MustCompile(`(?m)^ *(events \(distinct payments\)|published messages|effects applied|ledger total|expected|invariant:) .*$` +
		`|\d+ lost acks, \d+ crashes|\d+ injected failures;`)
	want := decided.FindAllString(sample, -1)
	r := runDocumented(t, nil)
	requireOK(t, r)
	got := decided.FindAllString(r.stdout, -1)
	if len(want) != 8 || len(got) != len(want) {
		t.Fatalf("sample rows %q, run rows %q\n%s", want, got, r)
	}
	for i := range want {
		if strings.TrimSpace(want[i]) != strings.TrimSpace(got[i]) {
			t.Errorf("README sample %q, the run prints %q", strings.TrimSpace(want[i]), strings.TrimSpace(got[i]))
		}
	}
}
