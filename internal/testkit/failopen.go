package testkit

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// FailOpenRun passes n messages, one after the other, through the dedup
// middleware on store with OnStoreError FailOpen, and returns how many of
// them its handler ran and the error the middleware returned for the
// last one (nil when it was acked). FailOpen runs a handler, unprotected,
// only when the Claim failed with an outage: a store that refuses the
// client (its credentials, its TLS) must leave every handler unrun and
// every message nacked.
func FailOpenRun(t testing.TB, store stores.Store, n int) (ran int, err error) {
	t.Helper()
	mw, err := middleware.New(middleware.Config{
		Store: store,
		Policy: dedup.Policy{
			Lease:        time.Minute,
			Retention:    time.Hour,
			StoreTimeout: 30 * time.Second, // a refusal is no timeout: it must not take this long
			OnStoreError: dedup.FailOpen,
			Logger:       watermill.NopLogger{},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
		ran++
		return nil, nil
	})
	for range n {
		_, err = h(message.NewMessage(watermill.NewUUID(), []byte("payload")))
	}
	return ran, err
}
