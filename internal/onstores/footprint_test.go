package onstores_test

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// heavy are the modules a service must not download for the tests of a
// library package whose own code does not import them: the stores'
// clients and drivers, the SQLite drivers, the brokers' clients and
// Watermill's pub/subs, and what only they bring (klauspost/compress
// through nats.go, x/text through pgx).
var heavy = []string{
	"github.com/redis/go-redis/v9",
	"github.com/nats-io/nats.go", "github.com/klauspost/compress",
	"github.com/jackc/pgx/v5", "golang.org/x/text",
	"github.com/go-sql-driver/mysql", "github.com/lib/pq",
	"modernc.org/sqlite", "modernc.org/libc", "github.com/mattn/go-sqlite3",
	"github.com/IBM/sarama", "github.com/twmb/franz-go", "github.com/twmb/franz-go/pkg/kfake",
	"github.com/rabbitmq/amqp091-go",
	"github.com/ThreeDotsLabs/watermill-amqp/v2", "github.com/ThreeDotsLabs/watermill-amqp/v3",
	"github.com/ThreeDotsLabs/watermill-kafka/v3", "github.com/ThreeDotsLabs/watermill-nats/v2",
	"github.com/ThreeDotsLabs/watermill-redisstream",
	"github.com/ThreeDotsLabs/watermill-sql/v3", "github.com/ThreeDotsLabs/watermill-sql/v4",
	"github.com/prometheus/client_golang",
}

// allowed are the heavy modules a library package's tests may import,
// each for a reason a user of that package shares.
var allowed = map[string][]string{
	// its tests run on a Kafka-protocol broker in the process, which a
	// Sarama user does not otherwise download
	"keyfuncs/kafkakeys": {"github.com/twmb/franz-go", "github.com/twmb/franz-go/pkg/kfake"},
	// the watermill-sql offsets are read from rows of a real PostgreSQL
	// or MySQL table
	"keyfuncs/sqlkeys":    {"github.com/jackc/pgx/v5", "golang.org/x/text", "github.com/go-sql-driver/mysql"},
	"keyfuncs/sqlkeys/v4": {"github.com/go-sql-driver/mysql"},
	// the v3 key matches the v2 one for the same delivery
	"keyfuncs/amqpkeys/v3": {"github.com/ThreeDotsLabs/watermill-amqp/v2"},
	// its series are checked against prommetrics' for the same run
	"otelmetrics": {"github.com/prometheus/client_golang"},
}

// notLibrary are the module's packages no service imports: programs,
// harnesses and the test kit, whose tests may import anything.
var notLibrary = []string{"acceptance", "bench", "cmd/", "router_example", "internal/testkit", "internal/onstores",
	"internal/readmetest", "internal/storeopen", "internal/cliflag", "internal/jsguard",
	"internal/redisclean", "internal/natsclean", "internal/sqlpool", "stores/internal/errtest"}

const module = "github.com/watermill-dedup/dedup"

// TestLibraryTestsImportTheirOwnBackendsOnly: go mod tidy in a service's
// module downloads what the tests of every library package it builds
// import. A library package's tests import no heavy module that its own
// code does not, but for the reasons in allowed: a Redis service does not
// download SQLite, nats.go or a broker's client for them.
func TestLibraryTestsImportTheirOwnBackendsOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	pkgs := goList(t, "{{.ImportPath}}", module+"/...")
	checked := 0
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		if slices.ContainsFunc(notLibrary, func(n string) bool { return strings.HasPrefix(rel, n) }) {
			continue
		}
		checked++
		own := goList(t, "{{with .Module}}{{.Path}}{{end}}", "-deps", p)
		tests := goList(t, "{{with .Module}}{{.Path}}{{end}}", "-deps", "-test", p)
		for _, m := range tests {
			if slices.Contains(heavy, m) && !slices.Contains(own, m) && !slices.Contains(allowed[rel], m) {
				t.Errorf("the tests of %s import %s, which the package does not: every service that builds %s downloads it; move the test to internal/onstores, or import the backend's own kit (internal/testkit/...)", p, m, p)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d library packages, want the module's 20 or more: %q", checked, pkgs)
	}
}

// goList runs go list -f format args and returns its lines, once each.
func goList(t *testing.T, format string, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-f", format}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return lines
}
