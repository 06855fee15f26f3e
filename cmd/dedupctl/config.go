package main

import (
	"errors"
	"flag"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
)

// The stores dedupctl connects to, the kinds of internal/storeopen:
// router_example's -store names, but for memory, which lives inside its
// process.
const (
	storeRedis    = "redis"
	storePostgres = "postgres"
	storeMySQL    = "mysql"
	storeSQLite   = "sqlite"
	storeNATS     = "nats"
	storeMemory   = "memory" // window only
)

// storeNames are the kinds dedupctl can reach: every one with a service.
var storeNames = storeopen.Names(func(k *storeopen.Kind) bool { return !k.InProcess() })

const (
	defaultTimeout = time.Minute
	// sqliteFile is the file router_example keeps in -dir.
	sqliteFile = storeopen.SQLiteFile
)

// config is what the command line and the environment say.
type config struct {
	// Where the records are. These flags are also read from the
	// environment (cliflag.EnvName). The settings of every store are
	// storeopen's; -run-id names router_example's run.
	store    string
	settings storeopen.Settings
	runID    string
	timeout  time.Duration

	// How to answer, and the commands' own flags: command line only.
	json           bool
	state          string
	keyPrefix      string
	id             string
	limit          int
	after          string
	yes            bool
	all            bool
	horizon        time.Duration
	horizonSet     bool // -horizon is on the command line
	rate           float64
	keysPerMessage int
	bytesPerRecord float64
}

// commandFlags are the flags each command takes besides the connection
// flags and -json.
var commandFlags = map[string][]string{
	"stats":   nil,
	"get":     {"id"},
	"list":    {"state", "prefix", "limit", "after"},
	"forget":  {"id", "prefix", "all", "yes"},
	"release": {"id", "prefix", "all", "yes"},
	"purge":   nil,
	"window":  {"horizon", "rate", "keys-per-message", "bytes-per-record"},
}

// connectionFlags are read from the environment too: -store, the flags
// of every store (storeopen.Settings), -run-id and -timeout.
var connectionFlags = slices.Concat([]string{"store"}, storeopen.Flags(), []string{"run-id", "timeout"})

func newFlagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("dedupctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)

	fs.StringVar(&c.store, "store", "", "the store: "+strings.Join(storeNames, " | "))
	c.settings.RegisterFlags(fs)
	fs.StringVar(&c.runID, "run-id", "", "router_example's run id: sets -redis-prefix to \"router_example:<run id>:\", -table and -nats-bucket to \"router_example_<run id>\"")
	c.timeout = defaultTimeout
	cliflag.DurationVar(fs, &c.timeout, "timeout", "give up after this `duration`")

	fs.BoolVar(&c.json, "json", false, "write JSON instead of a table")
	fs.StringVar(&c.state, "state", "", "list: only records in this state, processing | done")
	fs.StringVar(&c.id, "id", "", "get, forget, release: the record whose `id` list shows, instead of SCOPE KEY (on layouts that keep no scope and key)")
	fs.StringVar(&c.keyPrefix, "prefix", "", "list, forget, release: only records whose key starts with this `prefix` (needs a layout that keeps keys)")
	fs.IntVar(&c.limit, "limit", stores.DefaultListLimit, "list: most records to show")
	fs.StringVar(&c.after, "after", "", "list: the `cursor` a previous list printed, to show the next records")
	fs.BoolVar(&c.yes, "yes", false, "forget, release: do it (without -yes they only show what they would change)")
	fs.BoolVar(&c.all, "all", false, "forget, release: change every record -prefix matches, not just one")
	cliflag.DurationVar(fs, &c.horizon, "horizon", "window: the broker's longest redelivery horizon `duration` (SQS: receives x visibility; RabbitMQ: outage budget; Kafka: group recovery)")
	fs.Float64Var(&c.rate, "rate", 0, "window: messages per second, to size the storage (without it, window prints the retention only)")
	fs.IntVar(&c.keysPerMessage, "keys-per-message", 1, "window: dedup keys per message, one record each (router_example: 2, message id and payment id)")
	fs.Float64Var(&c.bytesPerRecord, "bytes-per-record", 0, "window: bytes a record takes (default: the benchmark figure of -store, or of every store; mysql and sqlite have none)")
	return fs
}

// parseArgs reads the environment and the command line: flags may come
// before and after the command and its arguments; "--" ends the flags.
// It returns flag.ErrHelp for -help.
func parseArgs(args []string, getenv func(string) string) (cfg config, cmd string, pos []string, err error) {
	fs := newFlagSet(&cfg)
	for _, name := range connectionFlags {
		if v := getenv(cliflag.EnvName(name)); v != "" {
			if err := fs.Set(name, v); err != nil {
				return cfg, "", nil, usagef("environment variable %s=%q: %v", cliflag.EnvName(name), v, err)
			}
		}
	}
	var given []string // the command line's flags
	trackSets(fs, &given)
	var tail []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, tail = args[:i], args[i+1:]
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return cfg, "", nil, err
			}
			return cfg, "", nil, &usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	pos = append(pos, tail...)
	if len(pos) == 0 {
		return cfg, "", nil, usagef("no command: want one of %s (see -help)", strings.Join(commands(), ", "))
	}
	cmd, pos = pos[0], pos[1:]
	if cmd == "help" {
		return cfg, "", nil, flag.ErrHelp
	}
	own, ok := commandFlags[cmd]
	if !ok {
		return cfg, "", nil, usagef("unknown command %q: want one of %s (see -help)", cmd, strings.Join(commands(), ", "))
	}
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "json" && !slices.Contains(connectionFlags, f.Name) && !slices.Contains(own, f.Name) {
			bad = append(bad, "-"+f.Name)
		}
	})
	if len(bad) > 0 {
		return cfg, "", nil, usagef("%s does not take %s (see -help)", cmd, strings.Join(bad, ", "))
	}
	cfg.horizonSet = slices.Contains(given, "horizon")
	if cfg.store == "" && cmd != "window" {
		cfg.store = impliedStore(given)
	}
	return cfg, cmd, pos, cfg.validate(cmd)
}

func commands() []string {
	return []string{"stats", "get", "list", "forget", "release", "purge", "window"}
}

var runIDRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// validate reports the first bad setting.
func (c *config) validate(cmd string) error {
	if c.runID != "" && !runIDRE.MatchString(c.runID) {
		return usagef("-run-id must be 1-16 lowercase letters or digits (router_example's), got %q", c.runID)
	}
	if c.timeout <= 0 {
		return usagef("-timeout must be positive, got %s", c.timeout)
	}
	if c.settings.PurgeGrace < 0 {
		return usagef("-purge-grace must not be negative, got %s", c.settings.PurgeGrace)
	}
	if c.state != "" {
		if _, err := stores.ParseRecordState(c.state); err != nil {
			return usagef("-state must be processing or done, got %q", c.state)
		}
	}
	if c.limit < 1 || c.limit > stores.MaxListLimit {
		return usagef("-limit must be between 1 and %d, got %d", stores.MaxListLimit, c.limit)
	}
	if cmd == "window" {
		return nil // it connects to nothing
	}
	k, ok := storeopen.Lookup(c.store)
	switch {
	case c.store == "":
		return usagef("no store: set -store (or DEDUP_STORE) to one of %s, or give the address flag of one store only (-redis-addr, -postgres-dsn, ...)",
			strings.Join(storeNames, ", "))
	case ok && k.InProcess():
		return usagef("the %s store lives inside its process: dedupctl cannot reach it (a service can call its stores.Admin methods itself); -store must be one of %s",
			k.Name, strings.Join(storeNames, ", "))
	case !ok:
		return usagef("unknown store %q: set -store (or DEDUP_STORE) to one of %s", c.store, strings.Join(storeNames, ", "))
	}
	if err := k.Check(c.storeSettings()); err != nil {
		return &usageError{err.Error()}
	}
	return nil
}

// storeSettings are the settings of the store, -run-id's run in them.
func (c *config) storeSettings() storeopen.Settings {
	s := c.settings
	s.RunID = c.runID
	return s
}

func isConnectionFlag(name string) bool { return slices.Contains(connectionFlags, name) }
