// Package cliflag holds the flag helpers the module's two commands share
// (router_example and cmd/dedupctl), so that both read durations and
// lists the same way, say the same thing about bad ones, and read a flag
// from the same environment variable.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DurationVar defines a duration flag whose error says a unit is needed:
// the flag package's own says only "parse error" for -lease=5.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name, usage string) {
	fs.Var(Duration{p}, name, usage)
}

// Duration is a flag.Value for a time.Duration (see DurationVar).
type Duration struct{ D *time.Duration }

func (v Duration) String() string {
	if v.D == nil {
		return "0s"
	}
	return v.D.String()
}

// Set parses s as a time.Duration; a bare number is refused with a hint
// to add a unit.
func (v Duration) Set(s string) error {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("a duration needs a unit, such as %[1]ss, %[1]sms, %[1]sm or %[1]sh", s)
		}
		return errors.New("not a duration: write a number and a unit, such as 5s, 300ms, 2m or 1h")
	}
	*v.D = d
	return nil
}

// SplitList splits a comma-separated list, trimming blanks and dropping
// empty items.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// envNames are the environment variables that do not follow the
// DEDUP_<FLAG> pattern: the services' addresses keep their usual names.
var envNames = map[string]string{
	"kafka-brokers": "KAFKA_BROKERS",
	"amqp-url":      "AMQP_URL",
	"nats-url":      "NATS_URL",
	"redis-addr":    "REDIS_ADDR",
	"postgres-dsn":  "POSTGRES_DSN",
	"mysql-dsn":     "MYSQL_DSN",
}

// EnvName is the environment variable of the flag -flag-name:
// DEDUP_FLAG_NAME, but for the services' addresses (REDIS_ADDR,
// POSTGRES_DSN, ...).
func EnvName(flagName string) string {
	if n, ok := envNames[flagName]; ok {
		return n
	}
	return "DEDUP_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
