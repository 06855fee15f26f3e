package dedup_test

import (
	"errors"
	"fmt"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// A retention window is checked against the broker's redelivery horizon
// at start-up: a redelivery arriving after the window runs again.
func ExampleCheckHorizon() {
	horizon := 24 * time.Hour // e.g. a RabbitMQ consumer-outage budget
	err := dedup.CheckHorizon(24*time.Hour, horizon)
	fmt.Println(errors.Is(err, dedup.ErrRetentionTooShort))
	fmt.Println(err)
	fmt.Println(dedup.CheckHorizon(32*time.Hour, horizon))
	// Output:
	// true
	// dedup: retention shorter than the redelivery horizon allows: retention 24h0m0s < 1.3 x redelivery horizon 24h0m0s = 31h12m0s: redeliveries after the window are processed again
	// <nil>
}

// The middleware and the publisher share one Policy; a zero field is its
// default.
func ExamplePolicy_WithDefaults() {
	p := dedup.Policy{Lease: 9 * time.Second}.WithDefaults()
	fmt.Println(p.Lease, p.Retention, p.StoreTimeout, p.Tuning.Heartbeat, p.Tuning.CompleteTimeout, p.Tuning.InProgressPoll)
	// Output: 9s 24h0m0s 5s 3s 9s 100ms
}
