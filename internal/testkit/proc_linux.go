package testkit

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// setPdeathsig has the kernel kill cmd when the test process dies
// without running its cleanups (a test timeout's panic).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits (5s at most) until every thread of process pid has
// stopped after a SIGSTOP: the signal is only queued when kill returns.
func waitStopped(pid int) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if allStopped(pid) {
			return
		}
	}
}

// allStopped reports whether every thread of pid is in state T.
func allStopped(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
