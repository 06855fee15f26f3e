//go:build !linux

package testkit

import (
	"os/exec"
	"time"
)

// SetPdeathsig does nothing outside Linux: the test's cleanups kill its
// servers, but a test process that dies without them leaves them
// running.
func SetPdeathsig(*exec.Cmd) {}

// WaitStopped gives a SIGSTOP a moment to take effect: outside Linux
// there is no /proc to watch it.
func WaitStopped(int) { time.Sleep(100 * time.Millisecond) }

// LockFile locks nothing outside Linux: callers that build the same file
// at once each build it, and the last rename wins.
func LockFile(string) (unlock func(), err error) { return func() {}, nil }
