package redistest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
)

// envChild makes this test binary the child of TestServersDieWithTheTestBinary:
// it starts the servers, prints their PIDs and waits to be killed.
const envChild = "REDISTEST_CHILD"

// TestServersDieWithTheTestBinary: a test binary killed before its
// cleanups run (a -timeout panic, a SIGKILL) takes its Redis servers
// along, plain and TLS: none is left running for the next run to meet.
func TestServersDieWithTheTestBinary(t *testing.T) {
	if os.Getenv(envChild) == "1" {
		redistest.StartRedis(t)
		redistest.StartRedisTLS(t, false)
		for _, pid := range childServers(t) {
			fmt.Printf("server %s\n", pid)
		}
		time.Sleep(time.Hour) // killed by the parent
		return
	}
	testkit.RequireRedis(t) // the redis-server binary is the shared service's
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTheTestBinary$", "-test.v")
	cmd.Env = append(os.Environ(), envChild+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for len(pids) < 2 && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "server" {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("child printed %q", sc.Text())
			}
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		_ = cmd.Process.Kill()
		t.Fatalf("the child printed %d server PIDs, want 2", len(pids))
	}
	_ = cmd.Process.Kill() // no cleanup runs
	_ = cmd.Wait()
	for _, pid := range pids {
		testkit.WaitFor(t, 30*time.Second, fmt.Sprintf("redis-server %d to die with the test binary", pid), func() bool {
			if syscall.Kill(pid, 0) != nil {
				return true
			}
			// A zombie waiting for init to reap it is gone too.
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(stat), ") Z ")
		})
	}
}

// childServers returns the PIDs of this process's redis-server
// children, from /proc.
func childServers(t *testing.T) []string {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	var pids []string
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat))
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if len(f) > 3 && f[3] == self && strings.Contains(string(cmdline), "redis-server") {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
