//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// consumerPIDs are the pids of the consumer processes a kill-demo run
// said it started.
var startedLine = regexp.MustCompile(`(?m)^router_example: started consumer process p\d+ \(pid (\d+)\)$`)

func consumerPIDs(t *testing.T, stderr string) []int {
	t.Helper()
	var pids []int
	for _, m := range startedLine.FindAllStringSubmatch(stderr, -1) {
		pid, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// requireNoConsumerLeft checks that none of pids is still a consumer
// process: gone, or (a reused pid) another program.
func requireNoConsumerLeft(t *testing.T, r exampleRun) {
	t.Helper()
	pids := consumerPIDs(t, r.stderr)
	if len(pids) == 0 {
		t.Fatalf("the run started no consumer process\n%s", r)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && !bytes.Contains(cmdline, []byte("-consumer-process=")) {
			continue // the pid went to another program
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("consumer process pid %d outlived the run\n%s", pid, r)
	}
}

// The kill demo: consumer processes of the binary on the in-process Kafka
// and a shared SQLite file, one SIGKILLed every second and replaced. The
// invariant holds, at least one process was killed (the producer holds
// back half of the messages until the first kill), the summary lists the
// kills, and no consumer process outlives the run.
func TestExampleKillDemo(t *testing.T) {
	t.Parallel()
	// The run's own -timeout bounds it, not runExample's two minutes: on a
	// busy machine the consumer group's rebalances after the kills take
	// their time.
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	r := runBinary(ctx, t, "", exampleEnv(), []string{"-cleanup", "-run-id=" + newTestRunID(), "-processes=3", "-kill-every=1s", "-events=300", "-timeout=5m"})
	requireOK(t, r)
	requireNoConsumerLeft(t, r)
	kills := regexp.MustCompile(`(?m)^  consumer processes\s+(\d+)  3 at a time; (\d+) SIGKILLed \(-kill-every 1s\) and replaced$`).FindStringSubmatch(r.stdout)
	if kills == nil {
		t.Fatalf("no consumer processes row\n%s", r)
	}
	started, _ := strconv.Atoi(kills[1])
	killed, _ := strconv.Atoi(kills[2])
	if killed < 1 || started != 3+killed {
		t.Fatalf("%d processes killed, %d started: want at least 1, and a replacement each\n%s", killed, started, r)
	}
	if n := strings.Count(r.stderr, "router_example: SIGKILLed consumer process p"); n != killed {
		t.Errorf("stderr tells of %d kills, the summary %d\n%s", n, killed, r)
	}
	if !regexp.MustCompile(`(?m)^  redelivered after kills\s+\d+  `).MatchString(r.stdout) {
		t.Errorf("no redelivered after kills row\n%s", r)
	}
	if got := len(regexp.MustCompile(`(?m)^    p\d+ \(pid \d+\) SIGKILLed at `).FindAllString(r.stdout, -1)); got != killed {
		t.Errorf("the summary details %d kills, want %d\n%s", got, killed, r)
	}
	// Every message listed as redelivered after a kill was awarded once.
	for _, l := range regexp.MustCompile(`(?m)^      \S+ .* -> p\d+: .*$`).FindAllString(r.stdout, -1) {
		if !strings.HasSuffix(l, " awarded once") {
			t.Errorf("a message redelivered after a kill was not awarded once: %q\n%s", l, r)
		}
	}
}

// Flags the kill demo cannot run with are refused before anything starts,
// with exit 2; so is -consumer-process given by hand.
func TestExampleKillDemoRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-kill-every=3s"}, "-kill-every kills consumer processes, and there are none: add -processes"},
		{[]string{"-processes=3", "-store=memory"}, "-processes needs a store its consumer processes share"},
		{[]string{"-processes=3", "-broker=gochannel"}, "-processes needs a broker its consumer processes share"},
		{[]string{"-processes=3", "-mode=lease", "-kill-every=3s"}, "-processes runs in transactional mode"},
		{[]string{"-processes=17"}, "-processes must be between 0 and 16"},
		{[]string{"-consumer-process=1"}, "-consumer-process is set by -processes"},
	} {
		r := runExample(t, newTestRunID(), tc.args...)
		if r.code != exitConfig || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want %d and %q\n%s", tc.args, r.code, exitConfig, tc.want, r)
			continue
		}
		if len(consumerPIDs(t, r.stderr)) > 0 {
			t.Errorf("%v: a refused run started consumer processes\n%s", tc.args, r)
		}
		requireOnlyOwnLines(t, r)
	}
}

// watchedBuffer is a bytes.Buffer several goroutines use, which says when
// a string first appears in it.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func (w *watchedBuffer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(b)
	if w.seen != nil && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
		w.seen = nil
	}
	return n, err
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// A signal ends the kill demo at once: exit 1, no verdict, and every
// consumer process stopped and reaped (SIGTERM, then the graceful
// shutdown of each).
func TestExampleKillDemoSignal(t *testing.T) {
	t.Parallel()
	bin := buildExample(t)
	args := []string{"-processes=2", "-kill-every=1s", "-events=5000", "-cleanup", "-run-id=" + newTestRunID()}
	cmd := exec.Command(bin, args...)
	cmd.Env = exampleEnv()
	var stdout bytes.Buffer
	seen := make(chan struct{})
	stderr := &watchedBuffer{want: "router_example: SIGKILLed consumer process p", seen: seen}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	select {
	case <-seen: // a process was killed and replaced: the demo is under way
	case err := <-done:
		t.Fatalf("the run ended before its first kill: %v\n%s\n%s", err, stdout.String(), stderr.String())
	case <-ctx.Done():
		t.Fatalf("no kill within 3 minutes\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatalf("the run did not end after SIGTERM\n%s", stderr.String())
	}
	r := exampleRun{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		r.code = exit.ExitCode()
	}
	if r.code != exitBroken || !strings.Contains(r.invariant(), "NOT CHECKED") || !strings.Contains(r.invariant(), "interrupted") {
		t.Fatalf("after SIGTERM: exit %d, want %d and an unchecked invariant\n%s", r.code, exitBroken, r)
	}
	requireNoConsumerLeft(t, r)
}
