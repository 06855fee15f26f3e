package testkit

import (
	"bytes"
	"runtime"
)

// WaitingInBatcher reports how many goroutines of the process wait in a
// batch.Batcher's Do for a result (the batcher under the Redis and SQL
// stores): calls queued behind a busy slot, or out in a batch whose
// statement or pipeline has not answered. A test that counts on it must
// not run in parallel with another that batches.
func WaitingInBatcher() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	waiting := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, rest, _ := bytes.Cut(g, []byte("\n"))
		if bytes.Contains(header, []byte("[select")) && bytes.HasPrefix(rest, []byte("github.com/watermill-dedup/dedup/stores/internal/batch.(*Batcher[")) {
			waiting++
		}
	}
	return waiting
}
