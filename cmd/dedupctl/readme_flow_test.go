package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/readmetest"
	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// buildExample builds router_example into a directory of t's.
func buildExample(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs router_example")
	}
	bin := filepath.Join(t.TempDir(), "router_example")
	if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "github.com/watermill-dedup/dedup/router_example").CombinedOutput(); err != nil {
		t.Fatalf("go build ./router_example: %v\n%s", err, out)
	}
	return bin
}

// exampleRunID finds the run id router_example printed.
var exampleRunID = regexp.MustCompile(`router_example: run ([a-z0-9]{1,16})\b`)

// runExample runs router_example with args (and the test's Redis), in
// the current directory, as a reader does: without -cleanup, so that
// its records stay. It returns the run id it printed, and deletes its
// Redis records (or its NATS bucket) when t ends.
func runExample(t *testing.T, bin, redisAddr string, args ...string) string {
	t.Helper()
	args = append(slices.Clone(args), "-redis-addr="+redisAddr)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	m := exampleRunID.FindStringSubmatch(out.String())
	if m != nil {
		prefix := "router_example:" + m[1] + ":"
		if slices.Contains(args, "-store=nats") {
			bucket := "router_example_" + m[1]
			js := natstest.JetStream(t, testkit.NATSURL())
			t.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), bucket) })
		}
		t.Cleanup(func() {
			client := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer client.Close()
			_ = redisclean.DeletePrefix(context.Background(), client, prefix)
		})
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) || err != nil || m == nil || !strings.Contains(out.String(), "invariant: OK") {
		t.Fatalf("router_example %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return m[1]
}

// recordRows counts the rows of records a list table shows.
func recordRows(out string) int {
	n := 0
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if slices.Contains(f, "done") || slices.Contains(f, "processing") {
			n++
		}
	}
	return n
}

// The sequences of the READMEs that read an example run's records run in
// the order they are written (#23): router_example (its records kept, as
// a reader's are), then each dedupctl command on them, the README's run
// id replaced by the one the run printed, as the README asks.
func TestReadmeFlows(t *testing.T) {
	bin := buildExample(t)
	redisAddr := testkit.RequireRedis(t)
	blocks := readmetest.Blocks(t, "../../router_example/README.md", "./router_example", "./cmd/dedupctl")
	seen := map[string]bool{}
	for _, block := range blocks {
		if block[0].Program != "./router_example" {
			t.Fatalf("%s: a sequence that does not start with router_example: %s", block[0].Where, block[0].Line)
		}
		cfg, _, _, err := parseArgs(block[1].Args, func(string) string { return "" })
		if err != nil {
			t.Fatalf("%s: %s: %v", block[1].Where, block[1].Line, err)
		}
		seen[cfg.store] = true
		t.Run(cfg.store, func(t *testing.T) {
			if cfg.store == storeNATS {
				testkit.RequireNATS(t)
			}
			t.Chdir(t.TempDir()) // -dir=./loyalty
			runID := runExample(t, bin, redisAddr, block[0].Args...)
			placeholder := cfg.runID
			for _, c := range block[1:] {
				if c.Program != "./cmd/dedupctl" {
					t.Fatalf("%s: %s: a second program in a sequence", c.Where, c.Line)
				}
				args := make([]string, len(c.Args))
				for i, a := range c.Args {
					args[i] = strings.ReplaceAll(a, placeholder, runID)
				}
				if cfg.store == storeRedis {
					args = append(args, "-redis-addr="+redisAddr)
				}
				r := dedupctl(t, args...)
				if r.code != exitOK || !ascii(r.stdout) {
					t.Fatalf("%s: %s (run %s): %s", c.Where, c.Line, runID, r)
				}
				_, cmd, _, _ := parseArgs(args, func(string) string { return "" })
				switch cmd {
				case "stats":
					r.want(t, exitOK, `stdout:"loyalty"`, "stdout:200 done")
				case "get":
					r.field(t, "state", "done")
					r.field(t, "outputs", "0")
				case "list":
					if n := recordRows(r.stdout); n != 3 {
						t.Fatalf("%s: %s lists %d records, want 3: %s", c.Where, c.Line, n, r)
					}
				}
			}
		})
	}
	if !seen[storeRedis] || !seen[storeSQLite] {
		t.Fatalf("router_example/README.md shows sequences on %v, want Redis and SQLite", seen)
	}

	// The root README: router_example -store=redis (Choose a store),
	// then the Redis commands of its dedupctl section: on the default
	// prefix, which holds none of the run's records (#7), and on the
	// run's, by -run-id.
	examples := readmetest.Commands(t, "./router_example", "../../README.md")
	commands := readmetest.Commands(t, "./cmd/dedupctl", "../../README.md")
	t.Run("README.md", func(t *testing.T) {
		t.Chdir(t.TempDir())
		var example *readmetest.Command
		for _, c := range examples {
			if slices.Contains(c.Args, "-store=redis") && !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "-broker") }) {
				example = &c
				break
			}
		}
		if example == nil {
			t.Fatal("README.md shows no router_example -store=redis")
		}
		runID := runExample(t, bin, redisAddr, append(example.Args, "-events=20")...)
		n := 0
		for _, c := range commands {
			cfg, cmd, pos, err := parseArgs(c.Args, func(string) string { return "" })
			if err != nil || cfg.store != storeRedis || cmd == "window" { // window: TestDocumentedCommands
				continue
			}
			n++
			args := append(slices.Clone(c.Args), "-redis-addr="+redisAddr)
			switch cmd {
			case "stats", "list":
				// Read-only: on the shared default prefix as written, or
				// on the run's.
				if cfg.runID != "" {
					for i, a := range args {
						args[i] = strings.ReplaceAll(a, cfg.runID, runID)
					}
				}
				r := dedupctl(t, args...)
				if r.code != exitOK || !ascii(r.stdout) {
					t.Fatalf("%s: %s after router_example run %s: %s", c.Where, c.Line, runID, r)
				}
				switch {
				case cfg.runID != "" && cmd == "stats":
					r.want(t, exitOK, `stdout:prefix "router_example:`+runID+`:"`, `stdout:"loyalty"`, "stdout:40 done")
				case cfg.runID == "" && (strings.Contains(r.stdout, runID) || strings.Contains(r.stdout, "router_example")):
					t.Fatalf("%s: %s shows router_example run %s on the store's prefix: %s", c.Where, c.Line, runID, r)
				}
			case "release", "forget":
				// It changes the record it names: on a prefix of the
				// test's own, holding it.
				prefix := "dedup-test-" + storetest.NewID() + ":"
				client := redis.NewClient(&redis.Options{Addr: redisAddr})
				t.Cleanup(func() {
					_ = redisclean.DeletePrefix(context.Background(), client, prefix)
					_ = client.Close()
				})
				s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, SkipServerCheck: true})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(context.Background())
				claim, err := s.Claim(t.Context(), pos[0], []string{pos[1]}, time.Minute)
				if err != nil || claim.Result != stores.Claimed {
					t.Fatalf("Claim: %+v, %v", claim, err)
				}
				if cmd == "forget" {
					if err := s.Complete(t.Context(), claim, time.Hour, nil); err != nil {
						t.Fatal(err)
					}
				}
				dedupctl(t, append(args, "-redis-prefix="+prefix)...).want(t, exitOK)
				if _, err := s.Get(t.Context(), pos[0], pos[1]); !errors.Is(err, stores.ErrNotFound) {
					t.Fatalf("%s: %s left the record: %v", c.Where, c.Line, err)
				}
			default:
				t.Fatalf("%s: %s: the test runs no %s on Redis", c.Where, c.Line, cmd)
			}
		}
		if n < 3 {
			t.Fatalf("README.md shows %d dedupctl commands on Redis, want its stats, list and release", n)
		}
	})
}
