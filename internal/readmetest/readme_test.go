package readmetest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
// for it.
func TestQuickstartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	bin, err := build(t, program(t, "points awarded for"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("Quickstart: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	readme, _ := os.ReadFile("../../README.md")
	shown := regexp.MustCompile(`(?s)It prints \(besides the log lines\):\n\n(.*?)\n\n`).FindSubmatch(readme)
	if shown == nil {
		t.Fatal("README.md does not show the Quickstart's output")
	}
	want := strings.ReplaceAll(string(shown[1]), "    ", "")
	if got := strings.TrimSpace(stdout.String()); got != strings.TrimSpace(want) {
		t.Errorf("Quickstart printed:\n%s\nthe README shows:\n%s", got, want)
	}
	if !strings.Contains(stderr.String(), "ERROR Dedup cannot process this message") || !strings.Contains(stderr.String(), "outcome=no_key") {
		t.Errorf("the keyless event was not logged at error level:\n%s", &stderr)
	}
}

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
