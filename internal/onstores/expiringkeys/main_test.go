package expiringkeys_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that nothing is left running: a Repository starts no
// goroutine (unlike Watermill's in-memory repository, whose cleanup loop
// nothing stops), and the tests close every store, pub/sub and
// middleware they open.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
