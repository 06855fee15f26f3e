package onstores_test

import (
	"bytes"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// light are the modules the tests of any library package may import
// beyond the package's own: goleak, the OpenTelemetry SDK (span tests),
// and Watermill with the modules its packages import (the test kit runs
// routers on gochannel). Together they add about 1.5 MB to what a
// service downloads (README, Footprint).
var light = []string{
	"go.uber.org/goleak",
	"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/auto/sdk", "go.opentelemetry.io/otel/log",
	"go.opentelemetry.io/otel/metric", "github.com/go-logr/logr", "github.com/go-logr/stdr", "golang.org/x/sys",
	"github.com/ThreeDotsLabs/watermill", "github.com/cenkalti/backoff/v5", "github.com/sony/gobreaker",
	"github.com/tidwall/gjson", "github.com/tidwall/match", "github.com/tidwall/pretty", "github.com/cespare/xxhash/v2",
	"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/trace", "github.com/google/uuid",
	"github.com/lithammer/shortuuid/v3", "github.com/oklog/ulid", "github.com/pkg/errors",
}

// allowed are the other modules a library package's tests may import,
// each for a reason a user of that package shares.
var allowed = map[string][]string{
	// its tests open their databases with pgx's database/sql driver,
	// whose pool the store's own code does not use
	"stores/sqlstore": {"github.com/jackc/puddle/v2", "golang.org/x/sync"},
	// the watermill-sql offsets are read from rows of a real PostgreSQL
	// or MySQL table
	"keyfuncs/sqlkeys": {"github.com/jackc/pgx/v5", "github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile",
		"github.com/jackc/puddle/v2", "golang.org/x/text", "golang.org/x/sync",
		"github.com/go-sql-driver/mysql", "filippo.io/edwards25519"},
	"keyfuncs/sqlkeys/v4": {"github.com/go-sql-driver/mysql", "filippo.io/edwards25519", "github.com/jackc/puddle/v2", "golang.org/x/sync"},
	// its tests run on a Kafka-protocol broker in the process
	"keyfuncs/kafkakeys": {"github.com/twmb/franz-go", "github.com/twmb/franz-go/pkg/kfake", "github.com/twmb/franz-go/pkg/kmsg"},
	// the v3 key matches the v2 one for the same delivery
	"keyfuncs/amqpkeys/v3": {"github.com/ThreeDotsLabs/watermill-amqp/v2"},
	// its series are checked against prommetrics' for the same run
	"otelmetrics": {"go.opentelemetry.io/otel/sdk/metric", "github.com/prometheus/client_golang",
		"github.com/prometheus/client_model", "github.com/prometheus/common", "github.com/prometheus/procfs",
		"github.com/beorn7/perks", "github.com/munnerz/goautoneg", "google.golang.org/protobuf"},
	// Prometheus's testutil compares with it
	"prommetrics": {"github.com/kylelemons/godebug"},
}

// notLibrary are the module's packages no service imports: programs,
// harnesses and the test kit, whose tests may import anything.
var notLibrary = []string{"acceptance", "bench", "cmd/", "router_example", "internal/testkit", "internal/onstores",
	"internal/readmetest", "internal/storeopen", "internal/cliflag", "internal/jsguard",
	"internal/redisclean", "internal/natsclean", "internal/sqlpool", "stores/internal/errtest"}

const module = "github.com/watermill-dedup/dedup"

// TestLibraryTestsImportTheirOwnBackendsOnly: go mod tidy in a service's
// module downloads what the tests of every library package it builds
// import, under every build tag. A library package's tests import no
// module its own code does not, but the light ones and those allowed for
// it: a Redis service does not download SQLite, nats.go or a broker's
// client for them.
func TestLibraryTestsImportTheirOwnBackendsOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	checked := 0
	for _, p := range goList(t, "{{.ImportPath}}", module+"/...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		if slices.ContainsFunc(notLibrary, func(n string) bool { return strings.HasPrefix(rel, n) }) {
			continue
		}
		checked++
		own := goList(t, "{{with .Module}}{{.Path}}{{end}}", "-deps", p)
		tests := goList(t, "{{with .Module}}{{.Path}}{{end}}", "-deps", "-test", p)
		if imports := taggedOutTestImports(t, p); len(imports) > 0 {
			tests = append(tests, goList(t, "{{with .Module}}{{.Path}}{{end}}", append([]string{"-deps", "-e"}, imports...)...)...)
		}
		for _, m := range tests {
			if m == module || slices.Contains(own, m) || slices.Contains(light, m) || slices.Contains(allowed[rel], m) {
				continue
			}
			t.Errorf("the tests of %s import %s, which the package does not: every service that builds %s downloads it; move the test to internal/onstores, or import the backend's own kit (internal/testkit/...)", p, m, p)
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d library packages, want the module's 20 or more", checked)
	}
}

// taggedOutTestImports returns what the test files of package p that
// this build leaves out (another GOOS, a build tag) import from outside
// the standard library and this module: go mod tidy reads them all, but
// for a file tagged ignore.
func taggedOutTestImports(t *testing.T, p string) []string {
	t.Helper()
	dir := goList(t, "{{.Dir}}", p)[0]
	var imports []string
	for _, name := range goList(t, "{{range .IgnoredGoFiles}}{{.}}\n{{end}}", p) {
		if !strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if ignored(f.Comments) {
			continue
		}
		for _, spec := range f.Imports {
			path, _ := strconv.Unquote(spec.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			if strings.Contains(first, ".") && !strings.HasPrefix(path, module) && !slices.Contains(imports, path) {
				imports = append(imports, path)
			}
		}
	}
	return imports
}

// ignored reports a //go:build line that holds only with the ignore tag:
// go mod tidy takes every other tag as set.
func ignored(groups []*ast.CommentGroup) bool {
	for _, g := range groups {
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			return err == nil && !expr.Eval(func(tag string) bool { return tag != "ignore" })
		}
	}
	return false
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
