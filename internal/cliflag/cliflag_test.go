package cliflag

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	var d time.Duration
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	DurationVar(fs, &d, "lease", "")
	if err := fs.Parse([]string{"-lease= 90s "}); err != nil || d != 90*time.Second {
		t.Fatalf("-lease=90s: %v, %v", d, err)
	}
	for arg, want := range map[string]string{"5": "a duration needs a unit, such as 5s", "soon": "not a duration"} {
		if err := fs.Parse([]string{"-lease=" + arg}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-lease=%s: %v, want %q", arg, err, want)
		}
	}
}

func TestSplitList(t *testing.T) {
	if got := SplitList(" a, ,b ,"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("SplitList = %q", got)
	}
	if got := SplitList(""); got != nil {
		t.Fatalf("SplitList(\"\") = %q, want nil", got)
	}
}

func TestEnvName(t *testing.T) {
	for flagName, want := range map[string]string{
		"store": "DEDUP_STORE", "run-id": "DEDUP_RUN_ID", "redis-addr": "REDIS_ADDR",
		"postgres-dsn": "POSTGRES_DSN", "mysql-dsn": "MYSQL_DSN", "kafka-brokers": "KAFKA_BROKERS",
		"amqp-url": "AMQP_URL", "nats-url": "NATS_URL", "broker": "DEDUP_BROKER", "metrics-addr": "DEDUP_METRICS_ADDR",
		"strict-retention": "DEDUP_STRICT_RETENTION",
	} {
		if got := EnvName(flagName); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", flagName, got, want)
		}
	}
}
