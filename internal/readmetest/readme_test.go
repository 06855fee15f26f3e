package readmetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

var (
	goBlock     = regexp.MustCompile("(?s)```go\n(.*?)```")
	packageMain = regexp.MustCompile(`(?m)^package main$`)
)

// build compiles src as a package of this module, without writing into the
// module tree (go build -overlay), and returns the binary's path.
func build(t *testing.T, src []byte) (string, error) {
	t.Helper()
	tmp := t.TempDir()
	file := filepath.Join(tmp, "main.go")
	if err := os.WriteFile(file, src, 0o600); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join("snippet", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: file}})
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, overlay, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "snippet")
	if out, err := exec.Command("go", "build", "-overlay", ov, "-o", bin, "./snippet").CombinedOutput(); err != nil {
		return "", &buildError{err, out}
	}
	return bin, nil
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

// programs returns README.md's whole programs (package main).
func programs(t *testing.T) [][]byte {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, b := range goBlock.FindAllSubmatch(readme, -1) {
		if packageMain.Match(b[1]) {
			out = append(out, b[1])
		}
	}
	if len(out) == 0 {
		t.Fatal("README.md has no package main snippet")
	}
	return out
}

// program returns the one README program containing marker.
func program(t *testing.T, marker string) []byte {
	t.Helper()
	for _, p := range programs(t) {
		if bytes.Contains(p, []byte(marker)) {
			return p
		}
	}
	t.Fatalf("README.md has no program containing %q", marker)
	return nil
}

func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	for i, p := range programs(t) {
		if _, err := build(t, p); err != nil {
			t.Errorf("README.md program %d does not compile: %v\n--- program ---\n%s", i+1, err, p)
		}
	}
}

// TestQuickstartRuns runs the Quickstart and compares its output with the
// one the README shows under it: one award for the payment delivered three
// times, the keyless event poisoned, and the middleware's error log line
// for it. It runs it as written (memstore), and with the store swapped for
// redisstore and natsstore, as its comment invites, twice on each: the
// records of the first run must not change the second's output.
func TestQuickstartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	src := program(t, "points awarded for")
	readme, _ := os.ReadFile("../../README.md")
	shown := regexp.MustCompile(`(?s)It prints \(besides the log lines\):\n\n(.*?)\n\n`).FindSubmatch(readme)
	if shown == nil {
		t.Fatal("README.md does not show the Quickstart's output")
	}
	want := strings.TrimSpace(strings.ReplaceAll(string(shown[1]), "    ", ""))
	const memstoreLine = "store, err := memstore.New(memstore.Config{})"
	if !bytes.Contains(src, []byte(memstoreLine)) {
		t.Fatalf("the Quickstart no longer opens its store with %q", memstoreLine)
	}
	swaps := []struct {
		name, service, addr, imports, open string
	}{
		{name: "memstore"},
		{"redisstore", "Redis", testkit.RedisAddr(),
			"\"github.com/redis/go-redis/v9\"\n\t\"github.com/watermill-dedup/dedup/stores/redisstore\"",
			"client := redis.NewClient(&redis.Options{Addr: %q})\n\tdefer client.Close()\n\tstore, err := redisstore.New(client, redisstore.Config{})"},
		{"natsstore", "NATS", testkit.NATSURL(),
			"\"github.com/watermill-dedup/dedup/stores/natsstore\"",
			"store, err := natsstore.Connect(context.Background(), %q, natsstore.Config{})"},
	}
	for _, sw := range swaps {
		t.Run(sw.name, func(t *testing.T) {
			prog := src
			if sw.open != "" {
				if sw.service == "Redis" {
					testkit.RequireRedis(t)
				} else {
					testkit.RequireNATS(t)
				}
				prog = bytes.Replace(prog, []byte(memstoreLine), []byte(fmt.Sprintf(sw.open, sw.addr)), 1)
				prog = bytes.Replace(prog, []byte(`"github.com/watermill-dedup/dedup/stores/memstore"`), []byte(sw.imports), 1)
			}
			bin, err := build(t, prog)
			if err != nil {
				t.Fatal(err)
			}
			for run := 1; run <= 2; run++ {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				var stdout, stderr bytes.Buffer
				cmd := exec.CommandContext(ctx, bin)
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				cancel()
				if err != nil {
					t.Fatalf("run %d: %v\nstdout:\n%s\nstderr:\n%s", run, err, &stdout, &stderr)
				}
				got := scopeID.ReplaceAllString(strings.TrimSpace(stdout.String()), "loyalty-…")
				if got != want {
					t.Errorf("run %d printed:\n%s\nthe README shows:\n%s", run, got, want)
				}
				logged := stderr.String()
				if strings.Count(logged, "ERROR Dedup cannot process this message") != 1 || !strings.Contains(logged, "outcome=no_key") {
					t.Errorf("run %d: the keyless event was not logged once at error level:\n%s", run, logged)
				}
				if strings.Contains(logged, "being processed by another") {
					t.Errorf("run %d: a copy was nacked as in progress:\n%s", run, logged)
				}
			}
		})
	}
}

// TestOutboxProgramRuns runs the README's transactional outbox program
// on PostgreSQL: the order handled twice enters the outbox once.
func TestOutboxProgramRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	dsn := testkit.RequirePostgres(t)
	bin, err := build(t, program(t, "outbox rows for"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "POSTGRES_DSN="+dsn)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("outbox program: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	readme, _ := os.ReadFile("../../README.md")
	if got := strings.TrimSpace(stdout.String()); got != "outbox rows for ORD-7: 1" || !bytes.Contains(readme, []byte("It prints `"+got+"`")) {
		t.Fatalf("the outbox program printed %q; the README says otherwise, or it is not one row", got)
	}
}

// scopeID is the Quickstart's per-run scope.
var scopeID = regexp.MustCompile(`loyalty-[0-9A-Za-z]+`)

// TestPrometheusProgramServesSeries runs the README's Prometheus program
// and reads /metrics: the outcome series of its handler are there before
// any message.
func TestPrometheusProgramServesSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	bin, err := build(t, program(t, "promhttp"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := `dedup_outcomes_total{outcome="claimed",scope="loyalty"} 0`
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://127.0.0.1:9464/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if strings.Contains(body, want) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/metrics never served %s; last body:\n%s\nstderr:\n%s", want, body, &stderr)
}
