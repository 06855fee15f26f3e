package batch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// batcher returns a Batcher over r's Exec with maxBatch and maxInFlight,
// and a context for its calls that ends after timeout or with the test.
func batcher(t *testing.T, r *recorder, maxBatch, maxInFlight int, timeout time.Duration) (*batch.Batcher[int, int], context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return batch.New(r.exec, maxBatch, maxInFlight), ctx
}

// queued waits until n calls are queued in b.
func queued(t *testing.T, b *batch.Batcher[int, int], n int) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "calls queued", func() bool { return b.Queued() == n })
}

// together runs f(0) … f(n-1), each in its own goroutine, and waits for
// them all.
func together(n int, f func(g int)) {
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { f(g) })
	}
	wg.Wait()
}
