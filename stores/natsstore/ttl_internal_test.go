package natsstore

import (
	"math"
	"testing"
	"time"
)

// TestTTLSeconds: whole seconds rounded up, at least one, at most two
// centuries (the server's expiry in Unix nanoseconds must not overflow).
func TestTTLSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                     "1",
		0:                                "1",
		time.Millisecond:                 "1",
		time.Second:                      "1",
		time.Second + 1:                  "2",
		2*time.Minute + time.Millisecond: "121",
		maxTTL:                           "6307200000",
		math.MaxInt64:                    "6307200000",
	} {
		if got := ttlSeconds(d); got != want {
			t.Errorf("ttlSeconds(%s) = %s, want %s", d, got, want)
		}
	}
}
