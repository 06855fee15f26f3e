//go:build !linux

package testkit

import (
	"os/exec"
	"time"
)

// setPdeathsig does nothing outside Linux: the test's cleanups kill its
// servers, but a test process that dies without them leaves them
// running.
func setPdeathsig(*exec.Cmd) {}

// waitStopped gives a SIGSTOP a moment to take effect: outside Linux
// there is no /proc to watch it.
func waitStopped(int) { time.Sleep(100 * time.Millisecond) }

// lockFile locks nothing outside Linux: callers that build the same file
// at once each build it, and the last rename wins.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
