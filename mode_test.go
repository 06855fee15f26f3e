package dedup_test

import (
	"errors"
	"testing"

	dedup "github.com/watermill-dedup/dedup"
)

func TestParseMode(t *testing.T) {
	for _, m := range []dedup.Mode{dedup.ModeLease, dedup.ModeAsyncComplete, dedup.ModeTransactional} {
		got, err := dedup.ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	if got, err := dedup.ParseMode("  Async-Complete "); err != nil || got != dedup.ModeAsyncComplete {
		t.Errorf("ParseMode with case and spaces = %v, %v", got, err)
	}
	for _, bad := range []string{"", "auto", "lease2", "Mode(3)"} {
		if _, err := dedup.ParseMode(bad); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("ParseMode(%q) err = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
