package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestMultiKeyClaimSurvivesReleaseChurn checks that a multi-key claim
// meeting records that their owners keep releasing decides instead of
// giving up: a record found live by the claim's INSERT and released
// before it is locked is a key to insert again, not a failure. Churn
// workers claim and release one key of the pair, or one of it and a
// third key, in a tight loop while the claimer claims the pair; every
// claim must return a result.
func TestMultiKeyClaimSurvivesReleaseChurn(t *testing.T) {
	forEachBackend(t, serverBackends, func(t *testing.T, b backend) {
		db := b.open(t)
		s := newStore(t, db, b.dialect, sqlstore.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const scope = "churn"
		pair := []string{"a", "b"}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				set := [][]string{{"a"}, {"b"}, {"b", "c"}, {"c", "a"}}[w%4]
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := s.Claim(ctx, scope, set, time.Minute)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("churn claim: %v", err)
						}
						return
					}
					if c.Result == stores.Claimed {
						if err := s.Release(ctx, c); err != nil {
							t.Errorf("churn release: %v", err)
							return
						}
					}
				}
			}()
		}
		var claimed, failed int
		for range 300 {
			c, err := s.Claim(ctx, scope, pair, time.Minute)
			if err != nil {
				failed++
				t.Logf("multi-key claim: %v", err)
				continue
			}
			if c.Result == stores.Claimed {
				claimed++
				if err := s.Release(ctx, c); err != nil {
					t.Fatalf("release: %v", err)
				}
			}
		}
		close(stop)
		wg.Wait()
		if failed > 0 {
			t.Errorf("%d of 300 multi-key claims failed under release churn (%d claimed)", failed, claimed)
		}
	})
}
