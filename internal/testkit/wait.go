package testkit

import (
	"errors"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, or fails t after timeout, naming
// what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, what, func() error {
		if !cond() {
			return errNotYet
		}
		return nil
	})
}

var errNotYet = errors.New("not yet")

// Eventually polls check until it returns nil, or fails t after timeout
// with what it waited for and check's last error.
func Eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	EventuallyEvery(t, timeout, 20*time.Millisecond, what, check)
}

// EventuallyEvery is Eventually polling every interval, for a check that
// costs a server a request.
func EventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if err == errNotYet {
				t.Fatalf("timed out after %s waiting for %s", timeout, what)
			}
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(interval)
	}
}
