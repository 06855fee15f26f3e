package batch_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// TestLaterAlwaysCarried: a sequential caller sends each call with Do and,
// after it, a write with DoLater from another goroutine (a consumer's
// claim, then its background Complete), with a linger far longer than the
// test; batches take random time. Once every write is queued, one more Do
// carries them all: none is left to its linger.
func TestLaterAlwaysCarried(t *testing.T) {
	for range 50 {
		b := batch.New(func(_ context.Context, calls []*batch.Call[int, int]) error {
			switch rand.IntN(4) {
			case 0:
				time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
			case 1:
				runtime.Gosched()
			}
			for _, c := range calls {
				c.Set(c.Req, nil)
			}
			return nil
		}, 128, 2)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel) // on a failure too: the writes still waiting return
		const n = 20
		var entered, done atomic.Int32
		for i := range n {
			if _, err := b.Do(ctx, i); err != nil {
				t.Fatal(err)
			}
			go func() {
				entered.Add(1)
				if _, err := b.DoLater(ctx, 1000+i, time.Hour); err != nil && ctx.Err() == nil {
					t.Error(err)
				}
				done.Add(1)
			}()
		}
		testkit.WaitFor(t, 10*time.Second, "every write queued or carried", func() bool {
			return entered.Load() == n && int(done.Load())+b.Queued() == n
		})
		if _, err := b.Do(ctx, -1); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, 10*time.Second, "every write carried", func() bool { return done.Load() == n })
	}
}
