package storeopen

import (
	"flag"
	"slices"
	"time"

	"github.com/watermill-dedup/dedup/internal/cliflag"
)

// The defaults of the services' settings, the local services of
// router_example's and dedupctl's flags.
const (
	DefaultRedisAddr   = "127.0.0.1:6379"
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
)

// SQLiteFile is the file router_example keeps in -dir, which -dir names.
const SQLiteFile = "loyalty.db"

// Settings are where each kind's service is and, for a program that
// administers a store (Request.Admin), how the store is configured: the
// flags RegisterFlags defines. A program with flags of its own (shared
// with its brokers, say) fills in the fields it has; each kind reads its
// own.
type Settings struct {
	Redis       RedisSettings  // redis
	PostgresDSN string         // postgres: -postgres-dsn
	MySQLDSN    string         // mysql: -mysql-dsn
	SQLite      SQLiteSettings // sqlite
	NATS        NATSSettings   // nats

	// Table is the SQL table (-table); empty: the store's default.
	Table string

	// RunID is router_example's run (dedupctl's -run-id), whose records
	// a Kind's RunName names: the key prefix or table when -redis-prefix
	// or -table does not name one.
	RunID string

	// PurgeGrace is -purge-grace: with Request.Admin, sqlstore's
	// PurgeGrace and natsstore's MaxLease, how long a purge keeps a
	// processing record whose lease ended. Zero: the store's default.
	PurgeGrace time.Duration
}

// RegisterFlags defines on fs the flags of every kind, bound to s (its
// values, or the Default settings, their defaults), and the flags
// several kinds share: -table and -purge-grace. See FlagKind for which
// kind a flag is of. RunID has no flag here: a program says which run.
func (s *Settings) RegisterFlags(fs *flag.FlagSet) {
	for _, k := range kinds {
		if k.flags != nil {
			k.flags(fs, s)
		}
	}
	fs.StringVar(&s.Table, "table", s.Table, "the SQL table, Config.Table (default \"dedup_inbox\", \"router_example_<run id>\" with -run-id)")
	cliflag.DurationVar(fs, &s.PurgeGrace, "purge-grace", "purge (SQL, NATS): keep processing records whose lease ended less than this `duration` ago; "+
		"keep it above your longest lease (default 15m, sqlstore's; NATS: 1h, natsstore's MaxLease)")
}

// Flags returns the names of the flags RegisterFlags defines.
func Flags() []string {
	var s Settings
	return flagNames(s.RegisterFlags)
}

// FlagKind returns the name of the kind whose flag name is: the one kind
// whose service or store it sets (-redis-addr is redis's, -nats-bucket
// nats's), and "" for a flag several kinds share (-table, -run-id,
// -purge-grace) or none.
func FlagKind(name string) string {
	for _, k := range kinds {
		if k.flags != nil && slices.Contains(flagNames(func(fs *flag.FlagSet) { k.flags(fs, new(Settings)) }), name) {
			return k.Name
		}
	}
	return ""
}

// flagNames returns the names of the flags define defines.
func flagNames(define func(*flag.FlagSet)) []string {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	define(fs)
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, f.Name) })
	return out
}
