package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/internal/storeopen"
)

// Brokers and stores the example can run on.
var (
	brokerNames   = []string{brokerGoChannel, brokerKafka, brokerKafkaEmbedded, brokerAMQP, brokerPostgres, brokerMySQL, brokerNATS, brokerRedisStreams}
	storeNames    = []string{storeMemory, storeRedis, storePostgres, storeMySQL, storeSQLite, storeNATS}
	producerNames = []string{producerWatermill, producerForeign}

	// foreignProducerBrokers have a producer of their own in the example
	// (producers.go): -producer=foreign is refused with the others before
	// anything connects.
	foreignProducerBrokers = []string{brokerKafkaEmbedded, brokerKafka, brokerAMQP, brokerPostgres, brokerMySQL}
)

const (
	brokerGoChannel     = "gochannel"
	brokerKafka         = "kafka"
	brokerKafkaEmbedded = "kafka-embedded"
	brokerAMQP          = "amqp"
	brokerPostgres      = "postgres"
	brokerMySQL         = "mysql"
	brokerNATS          = "nats"
	brokerRedisStreams  = "redis-streams"

	storeMemory   = "memory"
	storeRedis    = "redis"
	storePostgres = "postgres"
	storeMySQL    = "mysql"
	storeSQLite   = "sqlite"
	storeNATS     = "nats"

	modeAuto = "auto" // transactional on SQL stores, else lease (or -async-complete)

	// producerWatermill publishes with Watermill's publisher;
	// producerForeign with the broker's own client, as a service written
	// without Watermill does (see producers.go).
	producerWatermill = "watermill"
	producerForeign   = "foreign"
)

// Config is everything the example can be told, by flag, environment
// variable or YAML file. Every flag -some-name has the environment variable
// DEDUP_SOME_NAME (the service addresses use their usual names instead:
// KAFKA_BROKERS, AMQP_URL, NATS_URL, REDIS_ADDR, POSTGRES_DSN, MYSQL_DSN) and the YAML
// key some-name. Precedence: flag, then environment, then file, then default.
type Config struct {
	ConfigFile string

	// Where.
	Broker       string
	Store        string
	Mode         string
	Producer     string
	KafkaBrokers string
	KafkaRF      int
	AMQPURL      string
	NATSURL      string
	NATSAuth     storeopen.NATSAuth
	RedisAddr    string
	RedisTLS     storeopen.RedisTLS
	PostgresDSN  string
	MySQLDSN     string
	Dir          string
	RunID        string
	Cleanup      bool

	// The scenario.
	Events        int
	Customers     int
	Seed          uint64
	RepublishRate float64
	FailRate      float64
	LostAckRate   float64
	CrashRate     float64
	StaleEvents   int
	Concurrency   int
	Timeout       time.Duration

	// The router's retries.
	Retries         int
	RetryBackoff    time.Duration
	RetryMaxBackoff time.Duration

	// The middleware.
	Dedup              bool
	Lease              time.Duration
	InProgressWait     time.Duration
	Retention          time.Duration
	RedeliveryHorizon  time.Duration
	KafkaGroupRecovery time.Duration
	OutageBudget       time.Duration
	StrictRetention    bool
	OnStoreError       string
	AsyncComplete      bool

	// The kill demo (processes.go): consumer processes of this binary,
	// one of them SIGKILLed every KillEvery. ConsumerProcess is set by the
	// parent on each of them.
	Processes           int
	KillEvery           time.Duration
	ConsumerProcess     int
	KafkaSessionTimeout time.Duration

	// Observability.
	MetricsAddr string
	Linger      time.Duration
	Trace       string
	Verbose     bool

	// given holds the flags set on the command line or in the file, for
	// the warnings about flags the chosen broker, store or mode ignores;
	// fromFile those whose value comes from the file.
	given, fromFile map[string]bool
}

func defaultConfig() Config {
	return Config{
		Broker:       brokerGoChannel,
		Store:        storeSQLite,
		Mode:         modeAuto,
		Producer:     producerWatermill,
		KafkaBrokers: "127.0.0.1:9092",
		KafkaRF:      1,
		AMQPURL:      "amqp://guest:guest@127.0.0.1:5672/",
		NATSURL:      storeopen.DefaultNATSURL,
		RedisAddr:    storeopen.DefaultRedisAddr,
		PostgresDSN:  storeopen.DefaultPostgresDSN,
		MySQLDSN:     storeopen.DefaultMySQLDSN,

		Events:        1000,
		Customers:     50,
		Seed:          1,
		RepublishRate: 0.10,
		FailRate:      0.05,
		LostAckRate:   0.05,
		Concurrency:   8,
		Timeout:       2 * time.Minute,

		Retries:         5,
		RetryBackoff:    100 * time.Millisecond,
		RetryMaxBackoff: 2 * time.Second,

		Dedup: true,
		// Short, so that the takeovers of -crash-rate, one lease each and
		// one after another on a sequential consumer (RabbitMQ's, a Kafka
		// partition's), take seconds; the handler is far shorter, and the
		// heartbeat extends the lease of a slow one.
		Lease:              time.Second,
		Retention:          48 * time.Hour,
		KafkaGroupRecovery: 15 * time.Minute,
		OutageBudget:       24 * time.Hour,
		OnStoreError:       dedup.FailClosed.String(),
	}
}

// newFlagSet binds every flag to a field of c; the current values of c are
// the defaults.
func newFlagSet(c *Config, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("router_example", flag.ContinueOnError)
	fs.SetOutput(output)

	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML `file` whose keys are these flags' names (broker: kafka, events: 500, ...)")
	fs.StringVar(&c.Broker, "broker", c.Broker, "message broker: "+strings.Join(brokerNames, " | "))
	fs.StringVar(&c.Store, "store", c.Store, "dedup store: "+strings.Join(storeNames, " | "))
	fs.StringVar(&c.Mode, "mode", c.Mode, "store mode: lease | async-complete | transactional (SQL stores only) | auto (transactional on SQL stores, else lease)")
	fs.StringVar(&c.Producer, "producer", c.Producer, "who publishes the events: watermill (Watermill's publisher) | foreign (the broker's own client, no Watermill UUID: Sarama for Kafka, amqp091 for RabbitMQ, plain INSERTs for the SQL brokers; not with gochannel, nats or redis-streams)")
	fs.StringVar(&c.KafkaBrokers, "kafka-brokers", c.KafkaBrokers, "comma-separated Kafka bootstrap `addresses` (-broker=kafka)")
	fs.IntVar(&c.KafkaRF, "kafka-replication-factor", c.KafkaRF, "replication factor of the topics the example creates (-broker=kafka)")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ `URL` (-broker=amqp)")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS `URL`, a server with JetStream (-broker=nats, -store=nats): nats://user:password@host:port or nats://token@host:port carry credentials, tls:// asks for TLS")
	c.NATSAuth.RegisterFlags(fs)
	fs.StringVar(&c.RedisAddr, "redis-addr", c.RedisAddr, "Redis `address` (-store=redis, -broker=redis-streams): host:port, or a URL redis://user:password@host:port/db, rediss:// for TLS (a password is safer in REDIS_ADDR or the -config file than on the command line)")
	c.RedisTLS.RegisterFlags(fs)
	fs.StringVar(&c.PostgresDSN, "postgres-dsn", c.PostgresDSN, "PostgreSQL `DSN` (-broker=postgres, -store=postgres)")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", c.MySQLDSN, "MySQL/MariaDB `DSN` in go-sql-driver form (-broker=mysql, -store=mysql)")
	fs.StringVar(&c.Dir, "dir", c.Dir, "`directory` of the SQLite file (-store=sqlite); default: a temporary directory removed at exit")
	fs.StringVar(&c.RunID, "run-id", c.RunID, "suffix of every topic, queue, table, bucket and key prefix this run creates: 1-16 lowercase letters or digits; default: random")
	fs.BoolVar(&c.Cleanup, "cleanup", c.Cleanup, "drop the topics, queues, tables, buckets and keys this run created when it ends")

	fs.IntVar(&c.Events, "events", c.Events, "number of distinct payment.completed events to publish")
	fs.IntVar(&c.Customers, "customers", c.Customers, "number of distinct customers the payments belong to")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the scenario's random choices (amounts, customers, which messages fail)")
	fs.Float64Var(&c.RepublishRate, "republish-rate", c.RepublishRate, "fraction of events the producer publishes again under a new message id (a producer retry)")
	fs.Float64Var(&c.FailRate, "fail-rate", c.FailRate, "fraction of messages whose first handler run fails transiently, before its side effect (nack, redelivery)")
	fs.Float64Var(&c.LostAckRate, "lost-ack-rate", c.LostAckRate, "fraction of messages whose ack is lost after they were handled (nack, redelivery of a done message)")
	fs.Float64Var(&c.CrashRate, "crash-rate", c.CrashRate, "fraction of messages whose consumer 'crashes' after the side effect, before the record is done (lease: taken over when the lease expires; transactional: rolled back)")
	fs.IntVar(&c.StaleEvents, "stale-events", c.StaleEvents, "extra events published with a published_at older than the retention window (each is a ttl miss)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "most messages handled at once (the consumer's worker pool)")
	cliflag.DurationVar(fs, &c.Timeout, "timeout", "how long to wait for every message to be handled before giving up")

	fs.IntVar(&c.Retries, "retries", c.Retries, "times the router retries a failed handler in process, with backoff, before it nacks the message (0: nack at once)")
	cliflag.DurationVar(fs, &c.RetryBackoff, "retry-backoff", "wait before the first in-process retry; each next one waits twice as long")
	cliflag.DurationVar(fs, &c.RetryMaxBackoff, "retry-max-backoff", "longest wait between two in-process retries")

	fs.BoolVar(&c.Dedup, "dedup", c.Dedup, "use the dedup middleware; -dedup=false shows what duplicates do to the ledger")
	cliflag.DurationVar(fs, &c.Lease, "lease", "lease of a claim in lease mode: how long a crashed consumer blocks its message")
	cliflag.DurationVar(fs, &c.InProgressWait, "in-progress-wait", "how long a delivery whose keys another run holds waits for it (default: 1.5 x -lease)")
	cliflag.DurationVar(fs, &c.Retention, "retention", "how long done records are kept (the dedup window)")
	cliflag.DurationVar(fs, &c.RedeliveryHorizon, "redelivery-horizon", "the broker's longest redelivery delay; default: derived from -kafka-group-recovery or -outage-budget")
	cliflag.DurationVar(fs, &c.KafkaGroupRecovery, "kafka-group-recovery", "Kafka: longest time until a stalled consumer group is detected and restarted (the redelivery horizon)")
	cliflag.DurationVar(fs, &c.OutageBudget, "outage-budget", "RabbitMQ, SQL and gochannel: longest consumer outage you plan to tolerate (the redelivery horizon)")
	fs.BoolVar(&c.StrictRetention, "strict-retention", c.StrictRetention, "fail at start-up instead of warning when -retention < 1.3 x the redelivery horizon")
	fs.StringVar(&c.OnStoreError, "on-store-error", c.OnStoreError, "when the store is down: fail-closed (nack and retry) | fail-open (run unprotected, counted as bypassed)")
	fs.BoolVar(&c.AsyncComplete, "async-complete", c.AsyncComplete, "lease mode: ack as soon as the handler succeeds and record the message done in the background (one store round trip a message instead of two)")

	fs.IntVar(&c.Processes, "processes", c.Processes, "run this many consumer processes of this binary on a shared broker and store (the kill demo): the broker is then the in-process Kafka of this process, which the consumers reach on a loopback port (or -broker=kafka), and the store SQLite (shared -dir), postgres or mysql; 0: consume in this process")
	cliflag.DurationVar(fs, &c.KillEvery, "kill-every", "with -processes: SIGKILL one consumer process this often and start a replacement; the first comes once a quarter of the messages were handled if sooner, and the producer holds back half of them until it; 0: kill none")
	fs.IntVar(&c.ConsumerProcess, "consumer-process", c.ConsumerProcess, "internal, set by -processes on the processes it starts: run as consumer process `n`, consuming until SIGTERM and reporting every delivery on file descriptor 3")
	cliflag.DurationVar(fs, &c.KafkaSessionTimeout, "kafka-session-timeout", "Kafka consumer group session timeout: how long a consumer that died holds its partitions (a real broker refuses less than its group.min.session.timeout.ms, 6s by default); default: Sarama's 10s, 2s for the consumers of -processes on the in-process Kafka")

	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve Prometheus metrics on this `host:port` at /metrics (port 0: any free port); default: off")
	cliflag.DurationVar(fs, &c.Linger, "linger", "keep serving metrics this long after the summary (Ctrl-C ends it sooner)")
	fs.StringVar(&c.Trace, "trace", c.Trace, "write OpenTelemetry spans to this `file`, a JSON object a line (the stdout exporter's): each delivery's handler span and the dedup spans under it; default: off")
	fs.BoolVar(&c.Verbose, "v", c.Verbose, "log Watermill's and the middleware's info messages to stderr")

	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += " [env " + cliflag.EnvName(f.Name) + "]"
	})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: go run ./router_example [flags]

A payments -> loyalty router on an at-least-once broker, with the dedup
middleware in front of the handler. It publishes payment.completed events
(with producer retries under new message ids), injects redeliveries, and
checks that the loyalty ledger awarded every payment exactly once.

Flags (each also read from the environment variable shown, and from the
YAML file of -config under the flag's name; flags win over the environment,
which wins over the file):
`)
		printDefaults(fs)
		fmt.Fprintf(fs.Output(), `
Exit status: 0 the invariant holds, 1 it is broken or the run did not finish
(-timeout, or a signal: SIGINT or SIGTERM end it at any moment, set-up
included), 2 bad configuration or a service that cannot be used. Under
"go run" the shell sees 1 for any failure (go run prints "exit status 2"):
build the binary (go build -o router_example ./router_example) to see the
status.
`)
	}
	return fs
}

// loadConfig builds the Config from the defaults, the YAML file, the
// environment and the command line, in increasing precedence.
func loadConfig(args []string, getenv func(string) string, output io.Writer) (Config, error) {
	// First pass: only to find -config (and to answer -help), and which
	// flags the command line sets.
	// An error is returned, not printed with the whole usage after it.
	probe := defaultConfig()
	probeFS := newFlagSet(&probe, io.Discard)
	if err := probeFS.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			probeFS.SetOutput(output)
			probeFS.Usage()
		}
		return Config{}, err
	}
	given := map[string]bool{}
	probeFS.Visit(func(f *flag.Flag) { given[f.Name] = true })
	onCommandLine := maps.Clone(given)
	path := probe.ConfigFile
	if path == "" {
		path = getenv(cliflag.EnvName("config"))
	}

	cfg := defaultConfig()
	fs := newFlagSet(&cfg, io.Discard)
	if path != "" {
		if err := applyYAML(fs, path, given); err != nil {
			return Config{}, err
		}
	}
	var envErr error
	inEnv := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" || envErr != nil {
			return
		}
		if v := getenv(cliflag.EnvName(f.Name)); v != "" {
			inEnv[f.Name] = true
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("environment variable %s=%q: %w", cliflag.EnvName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return Config{}, envErr
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q (flags only; see -help)", fs.Args())
	}
	cfg.ConfigFile = path
	cfg.given = given
	cfg.fromFile = map[string]bool{}
	for name := range given {
		if !onCommandLine[name] && !inEnv[name] {
			cfg.fromFile[name] = true
		}
	}
	// -processes needs a broker the processes share: the in-process
	// Kafka, unless a broker was chosen.
	if cfg.Processes > 0 && !given["broker"] && getenv(cliflag.EnvName("broker")) == "" {
		cfg.Broker = brokerKafkaEmbedded
	}
	return cfg, cfg.sourced(cfg.Validate())
}

// flagInError finds the first flag an error names.
var flagInError = regexp.MustCompile(`(?:^|[\s(])(-[a-z][a-z0-9-]*)`)

// sourced adds to err, when it names a setting (storeopen's errors do)
// whose value came from the -config file, that file: the flag or variable
// it names is not where the value is.
func (c Config) sourced(err error) error {
	var setting string
	var ue *storeopen.UnreachableError
	var se *storeopen.SettingError
	switch {
	case errors.As(err, &ue):
		setting = ue.Setting
	case errors.As(err, &se):
		setting = se.Setting
	case err == nil:
		return nil
	default:
		// Validate's errors name their flag first: "-events must be ...",
		// "unknown store ...: set -store".
		m := flagInError.FindStringSubmatch(err.Error())
		if m == nil {
			return err
		}
		setting = m[1]
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(setting, "-"), " ")
	if !c.fromFile[name] {
		return err
	}
	return fmt.Errorf("%w (the value comes from key %s of %s)", err, name, c.ConfigFile)
}

// applyYAML sets the flags named by the keys of the YAML mapping in path,
// and adds their names to given.
func applyYAML(fs *flag.FlagSet, path string, given map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file (-config): %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s line %d: want a mapping of flag names to values", path, root.Line)
	}
	lines := map[string]int{} // key -> its line
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		if name == "config" || fs.Lookup(name) == nil {
			return fmt.Errorf("config file %s line %d: unknown key %q (the keys are the flag names; see -help)", path, k.Line, name)
		}
		// yaml.v3 refuses a duplicate key only when it decodes into a map
		// or a struct: the second would silently win.
		if first, dup := lines[name]; dup {
			return fmt.Errorf("config file %s line %d: key %s is given twice (first on line %d)", path, k.Line, name, first)
		}
		lines[name] = k.Line
		given[name] = true
		value, err := yamlValue(v)
		if err != nil {
			return fmt.Errorf("config file %s line %d: key %s: %w", path, v.Line, name, err)
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("config file %s line %d: key %s: %w", path, v.Line, name, err)
		}
	}
	return nil
}

// yamlValue turns a scalar, or a sequence of scalars (joined with commas,
// for kafka-brokers), into a flag value.
func yamlValue(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return "", errors.New("a list may only hold plain values")
			}
			parts = append(parts, c.Value)
		}
		return strings.Join(parts, ","), nil
	default:
		return "", errors.New("want a plain value or a list of plain values")
	}
}

var runIDRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// Validate reports the first invalid setting, naming its flag.
func (c Config) Validate() error {
	if !slices.Contains(brokerNames, c.Broker) {
		return fmt.Errorf("unknown broker %q: set -broker (or DEDUP_BROKER) to one of %s", c.Broker, strings.Join(brokerNames, ", "))
	}
	if !slices.Contains(storeNames, c.Store) {
		return fmt.Errorf("unknown store %q: set -store (or DEDUP_STORE) to one of %s", c.Store, strings.Join(storeNames, ", "))
	}
	if c.Mode != modeAuto {
		if _, err := dedup.ParseMode(c.Mode); err != nil {
			return fmt.Errorf("unknown mode %q: set -mode (or DEDUP_MODE) to auto, lease, async-complete or transactional", c.Mode)
		}
	}
	if !slices.Contains(producerNames, c.Producer) {
		return fmt.Errorf("unknown producer %q: set -producer (or DEDUP_PRODUCER) to one of %s", c.Producer, strings.Join(producerNames, ", "))
	}
	if c.Producer == producerForeign && !slices.Contains(foreignProducerBrokers, c.Broker) {
		if c.Broker == brokerGoChannel {
			return errors.New("-producer=foreign publishes with the broker's own client, and gochannel has none: use it with -broker=kafka-embedded, kafka, amqp, postgres or mysql, or keep -producer=watermill")
		}
		return fmt.Errorf("-producer=foreign is not available with -broker=%s: the example has a foreign producer for %s only; keep -producer=watermill, or choose one of those brokers", c.Broker, strings.Join(foreignProducerBrokers, ", "))
	}
	if c.Mode != modeAuto && c.mode() == dedup.ModeTransactional && !isSQLStore(c.Store) {
		return fmt.Errorf("-mode=transactional needs a SQL store (-store=sqlite, postgres or mysql): the %s store has lease mode only", c.Store)
	}
	if c.RunID != "" && !runIDRE.MatchString(c.RunID) {
		return fmt.Errorf("-run-id must be 1-16 lowercase letters or digits, got %q", c.RunID)
	}
	if c.Broker == brokerKafka && len(cliflag.SplitList(c.KafkaBrokers)) == 0 {
		return errors.New("-broker=kafka needs -kafka-brokers (or KAFKA_BROKERS), such as 127.0.0.1:9092")
	}
	if c.KafkaRF < 1 {
		return fmt.Errorf("-kafka-replication-factor must be at least 1, got %d", c.KafkaRF)
	}
	if c.Events < 1 || c.Events > 1_000_000 {
		return fmt.Errorf("-events must be between 1 and 1000000, got %d", c.Events)
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		return fmt.Errorf("-concurrency must be between 1 and 1024, got %d", c.Concurrency)
	}
	if c.Retries < 0 || c.Retries > 100 {
		return fmt.Errorf("-retries must be between 0 and 100, got %d", c.Retries)
	}
	if c.RetryMaxBackoff < c.RetryBackoff {
		return fmt.Errorf("-retry-max-backoff (%s) must be at least -retry-backoff (%s)", c.RetryMaxBackoff, c.RetryBackoff)
	}
	if c.Customers < 1 {
		return fmt.Errorf("-customers must be at least 1, got %d", c.Customers)
	}
	if c.StaleEvents < 0 || c.StaleEvents > c.Events {
		return fmt.Errorf("-stale-events must be between 0 and -events (%d), got %d", c.Events, c.StaleEvents)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"republish-rate", c.RepublishRate}, {"fail-rate", c.FailRate}, {"lost-ack-rate", c.LostAckRate}, {"crash-rate", c.CrashRate}} {
		if r.v < 0 || r.v > 1 {
			return fmt.Errorf("-%s must be between 0 and 1, got %v", r.name, r.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{
		{"timeout", c.Timeout, time.Second},
		{"lease", c.Lease, 100 * time.Millisecond},
		{"retention", c.Retention, time.Second},
		{"in-progress-wait", c.InProgressWait, 0},
		{"redelivery-horizon", c.RedeliveryHorizon, 0},
		{"kafka-group-recovery", c.KafkaGroupRecovery, 0},
		{"outage-budget", c.OutageBudget, 0},
		{"linger", c.Linger, 0},
		{"retry-backoff", c.RetryBackoff, time.Millisecond},
		{"kill-every", c.KillEvery, 0},
		{"kafka-session-timeout", c.KafkaSessionTimeout, 0},
	} {
		if d.v < d.min {
			return fmt.Errorf("-%s must be at least %s, got %s", d.name, d.min, d.v)
		}
	}
	if c.OnStoreError != dedup.FailClosed.String() && c.OnStoreError != dedup.FailOpen.String() {
		return fmt.Errorf("-on-store-error must be fail-closed or fail-open, got %q", c.OnStoreError)
	}
	if c.AsyncComplete && c.mode() == dedup.ModeTransactional && c.Dedup {
		return errors.New("-async-complete cannot be combined with transactional mode (the record commits with the handler's writes): use -mode=lease")
	}
	if c.OnStoreError == dedup.FailOpen.String() && c.mode() == dedup.ModeTransactional && c.Dedup {
		return errors.New("-on-store-error=fail-open cannot be combined with transactional mode (the handler's writes need the store's database): use -mode=lease")
	}
	if err := c.validateProcesses(); err != nil {
		return err
	}
	if c.Store == storeRedis || c.Broker == brokerRedisStreams {
		if _, err := storeopen.ParseRedis(storeopen.RedisConfig{Addr: c.RedisAddr, TLS: c.RedisTLS}); err != nil {
			return err // shows no password
		}
	}
	if c.Linger > 0 && c.MetricsAddr == "" {
		return errors.New("-linger keeps the metrics endpoint up: set -metrics-addr too")
	}
	return nil
}

// storeSettings are the settings of the store, in storeopen's terms:
// the services' flags, which the store shares with the brokers.
func (c Config) storeSettings() storeopen.Settings {
	return storeopen.Settings{
		Redis:       storeopen.RedisSettings{RedisConfig: storeopen.RedisConfig{Addr: c.RedisAddr, TLS: c.RedisTLS}},
		PostgresDSN: c.PostgresDSN,
		MySQLDSN:    c.MySQLDSN,
		SQLite:      storeopen.SQLiteSettings{Dir: c.Dir},
		NATS:        storeopen.NATSSettings{URL: c.NATSURL, Auth: c.NATSAuth},
	}
}

// mode is the middleware's mode: -mode (auto: transactional on SQL
// stores, else lease), with -async-complete turning lease into
// async-complete. Validate has checked -mode.
func (c Config) mode() dedup.Mode {
	m := dedup.ModeLease
	switch {
	case c.Mode != modeAuto:
		m, _ = dedup.ParseMode(c.Mode)
	case isSQLStore(c.Store):
		m = dedup.ModeTransactional
	}
	if m == dedup.ModeLease && c.AsyncComplete {
		m = dedup.ModeAsyncComplete
	}
	return m
}

// storeErrorPolicy is -on-store-error, which Validate checked.
func (c Config) storeErrorPolicy() dedup.StoreErrorPolicy {
	if c.OnStoreError == dedup.FailOpen.String() {
		return dedup.FailOpen
	}
	return dedup.FailClosed
}

// warnings lists the flags given on the command line or in the file that
// the chosen broker, store or mode ignores. Environment variables are not
// checked: a shell's REDIS_ADDR may well be meant for other programs.
func (c Config) warnings() []string {
	var out []string
	ignored := func(name, why string) {
		if c.given[name] {
			out = append(out, fmt.Sprintf("-%s is ignored %s", name, why))
		}
	}
	if c.Broker != brokerKafka {
		ignored("kafka-brokers", "without -broker=kafka")
		ignored("kafka-replication-factor", "without -broker=kafka")
	}
	if !isKafkaBroker(c.Broker) {
		ignored("kafka-session-timeout", "without a Kafka broker")
	}
	if c.Broker != brokerAMQP {
		ignored("amqp-url", "without -broker=amqp")
	}
	if c.Broker != brokerNATS && c.Store != storeNATS {
		for _, name := range append([]string{"nats-url"}, storeopen.NATSAuthFlags...) {
			ignored(name, "without -broker=nats or -store=nats")
		}
	}
	if c.Store != storeRedis && c.Broker != brokerRedisStreams {
		for _, name := range append([]string{"redis-addr"}, storeopen.RedisTLSFlags...) {
			ignored(name, "without -store=redis or -broker=redis-streams")
		}
	}
	if c.Broker != brokerPostgres && c.Store != storePostgres {
		ignored("postgres-dsn", "without -broker=postgres or -store=postgres")
	}
	if c.Broker != brokerMySQL && c.Store != storeMySQL {
		ignored("mysql-dsn", "without -broker=mysql or -store=mysql")
	}
	if c.Store != storeSQLite {
		ignored("dir", "without -store=sqlite")
	}
	switch {
	case !c.Dedup:
		for _, name := range []string{"mode", "lease", "in-progress-wait", "on-store-error", "async-complete"} {
			ignored(name, "with -dedup=false (no middleware)")
		}
	case c.mode() == dedup.ModeTransactional:
		ignored("lease", "in transactional mode (it has no lease)")
		ignored("in-progress-wait", "in transactional mode (a duplicate waits on the record's lock)")
	}
	switch {
	case c.RedeliveryHorizon > 0:
		ignored("kafka-group-recovery", "with -redelivery-horizon")
		ignored("outage-budget", "with -redelivery-horizon")
	case isKafkaBroker(c.Broker):
		ignored("outage-budget", "with Kafka (its redelivery horizon is -kafka-group-recovery)")
	default:
		ignored("kafka-group-recovery", "without a Kafka broker (the redelivery horizon is -outage-budget)")
	}
	return out
}

// printDefaults is flag.PrintDefaults, naming a cliflag.Duration's type.
func printDefaults(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if _, ok := f.Value.(cliflag.Duration); ok && !strings.Contains(f.Usage, "`") {
			typ = "duration"
		}
		var b strings.Builder
		b.WriteString("  -" + f.Name)
		if typ != "" {
			b.WriteString(" " + typ)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t"))
		// The default as shown, computed here: the flag is not changed, so
		// that printing twice (flag.Parse prints the usage on -help before
		// loadConfig does) prints the same.
		def, zero := f.DefValue, false
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case string:
				zero = def == ""
				def = strconv.Quote(def)
			case bool:
				zero = def == "false"
			default:
				zero = def == "0"
			}
		} else {
			zero = def == "0s"
		}
		if !zero {
			fmt.Fprintf(&b, " (default %s)", def)
		}
		fmt.Fprintln(fs.Output(), b.String())
	})
}

// inProgressWait defaults to 1.5 x the lease: a delivery blocked by a
// crashed consumer's claim then waits for the takeover instead of cycling
// through nacks.
func (c Config) inProgressWait() time.Duration {
	if c.InProgressWait > 0 {
		return c.InProgressWait
	}
	return c.Lease + c.Lease/2
}

func isSQLStore(s string) bool {
	return s == storePostgres || s == storeMySQL || s == storeSQLite
}

func isSQLBroker(b string) bool { return b == brokerPostgres || b == brokerMySQL }

func isKafkaBroker(b string) bool { return b == brokerKafka || b == brokerKafkaEmbedded }

// horizon is the broker's maximum redelivery horizon and where it comes
// from, for the retention-window check.
type horizon struct {
	d      time.Duration
	source string
}

// redeliveryHorizon is -redelivery-horizon, or derived from the broker:
// Kafka's group recovery time, the consumer-outage budget for the rest
// (RabbitMQ and the SQL pub/subs keep a message until it is acked, so the
// longest outage you tolerate is the longest delay before a redelivery).
// For SQS it would be maxReceiveCount x the visibility timeout.
func (c Config) redeliveryHorizon() horizon {
	switch {
	case c.RedeliveryHorizon > 0:
		return horizon{c.RedeliveryHorizon, "-redelivery-horizon"}
	case isKafkaBroker(c.Broker):
		return horizon{c.KafkaGroupRecovery, "Kafka consumer-group recovery time, -kafka-group-recovery"}
	case c.Broker == brokerAMQP:
		return horizon{c.OutageBudget, "RabbitMQ consumer-outage budget, -outage-budget"}
	case c.Broker == brokerNATS:
		// Unlimited MaxDeliver: a message waits in the stream (MaxAge
		// natsMaxAge) until a member of the group acks it.
		return horizon{min(c.OutageBudget, natsMaxAge), "NATS JetStream consumer-outage budget, -outage-budget, within the stream's MaxAge"}
	case c.Broker == brokerRedisStreams:
		// A pending entry waits until a live member claims it, after
		// redisClaimIdle, for as long as the stream keeps it.
		return horizon{c.OutageBudget + redisClaimIdle, "Redis Streams consumer-outage budget, -outage-budget, + the claim idle time"}
	default:
		return horizon{c.OutageBudget, "consumer-outage budget, -outage-budget"}
	}
}

// retentionCheck is the retention rule: window >= 1.3 x horizon.
type retentionCheck struct {
	retention time.Duration
	horizon   horizon
	minimum   time.Duration
}

func (c Config) retentionCheck() retentionCheck {
	h := c.redeliveryHorizon()
	return retentionCheck{
		retention: c.Retention,
		horizon:   h,
		minimum:   time.Duration(float64(h.d) * dedup.RetentionSafetyFactor),
	}
}

// retentionAdvice explains a failed dedup.CheckHorizon with the
// example's flags; it wraps err (dedup.ErrRetentionTooShort).
func retentionAdvice(c Config, err error) error {
	return &retentionError{detail: c.retentionCheck().detail(), err: err}
}

type retentionError struct {
	detail string
	err    error
}

func (e *retentionError) Error() string {
	return "the dedup window is too short: " + e.detail + ". A redelivery arriving after the window runs the handler again (counted as ttl_miss). Raise -retention, or correct the horizon (-redelivery-horizon, -kafka-group-recovery, -outage-budget)"
}

func (e *retentionError) Unwrap() error { return e.err }

func (r retentionCheck) ok() bool { return r.horizon.d == 0 || r.retention >= r.minimum }

// String is the check's verdict and detail, for the summary.
func (r retentionCheck) String() string {
	if r.horizon.d == 0 {
		return fmt.Sprintf("retention %s; redelivery horizon unknown (set -redelivery-horizon)", r.retention)
	}
	if r.ok() {
		return "OK: " + r.detail()
	}
	return "TOO SHORT: " + r.detail()
}

func (r retentionCheck) detail() string {
	op := ">="
	if !r.ok() {
		op = "<"
	}
	return fmt.Sprintf("retention %s %s %.1f x redelivery horizon %s (%s) = %s",
		r.retention, op, dedup.RetentionSafetyFactor, r.horizon.d, r.horizon.source, r.minimum)
}

// maxProcesses bounds -processes: each is a Go process with its own
// connections, on one machine.
const maxProcesses = 16

// validateProcesses checks the kill demo's settings (processes.go).
func (c Config) validateProcesses() error {
	if c.Processes < 0 || c.Processes > maxProcesses {
		return fmt.Errorf("-processes must be between 0 and %d, got %d", maxProcesses, c.Processes)
	}
	if c.ConsumerProcess < 0 {
		return fmt.Errorf("-consumer-process must not be negative, got %d", c.ConsumerProcess)
	}
	if c.Processes == 0 {
		if c.KillEvery > 0 {
			return errors.New("-kill-every kills consumer processes, and there are none: add -processes (such as -processes=3)")
		}
		return nil
	}
	switch {
	case c.ConsumerProcess > 0:
		return errors.New("-consumer-process is set by -processes on the processes it starts: give one of them, not both")
	case !isKafkaBroker(c.Broker):
		return fmt.Errorf("-processes needs a broker its consumer processes share: kafka-embedded (the default with -processes: this process hosts it on a loopback port) or kafka; %s is not available with it", c.Broker)
	case !isSQLStore(c.Store):
		return fmt.Errorf("-processes needs a store its consumer processes share, with the loyalty ledger in the same database: sqlite (the default), postgres or mysql; the %s store is not available with it", c.Store)
	case c.Dedup && c.mode() != dedup.ModeTransactional:
		return errors.New("-processes runs in transactional mode (the ledger commits with the dedup record, so a SIGKILL rolls both back): leave -mode out or set it to transactional")
	case c.Trace != "":
		return errors.New("-trace is not available with -processes: the handlers run in the consumer processes")
	case c.MetricsAddr != "":
		return errors.New("-metrics-addr is not available with -processes: the handlers run in the consumer processes")
	}
	return nil
}
