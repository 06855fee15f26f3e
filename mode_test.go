package dedup_test

import (
	"errors"
	"flag"
	"io"
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

func TestModeText(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var m dedup.Mode
	fs.TextVar(&m, "mode", dedup.ModeLease, "")
	if err := fs.Parse([]string{"-mode=transactional"}); err != nil || m != dedup.ModeTransactional {
		t.Fatalf("flag -mode=transactional: %v, %v", m, err)
	}
	if err := fs.Parse([]string{"-mode=bogus"}); err == nil {
		t.Fatal("flag -mode=bogus accepted")
	}
	if b, err := dedup.ModeAsyncComplete.MarshalText(); err != nil || string(b) != "async-complete" {
		t.Errorf("MarshalText = %q, %v", b, err)
	}
	if _, err := dedup.Mode(9).MarshalText(); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Errorf("MarshalText of Mode(9) err = %v, want ErrInvalidConfig", err)
	}
}
