package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// One kind of error is logged once a window while it lasts, with the
// count held back; errors that differ only in the message they name are
// one kind, other causes are another, and the rest is said at the end.
func TestIncidentsLogAKindOnceAWindow(t *testing.T) {
	now := time.Unix(0, 0)
	in := newIncidents(10*time.Second, func() time.Time { return now })
	cause := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	storeErr := func(i int) error {
		return fmt.Errorf("%w: message m-%d, scope %q: %w", dedup.ErrStore, i, "loyalty", cause)
	}
	var buf bytes.Buffer
	logger := newLogger(&buf, false, in)
	for i := range 1000 {
		logger.Error("Handler returned error", storeErr(i), nil)
		now = now.Add(5 * time.Millisecond) // 5 s in all
	}
	if n := strings.Count(buf.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d lines for 1000 errors of one kind in 5s, want 1:\n%s", n, buf.String())
	}
	// Another cause is another kind, logged at once.
	logger.Error("Handler returned error", fmt.Errorf("%w: message m-1: %w", dedup.ErrStore, errors.New("deadlock detected")), nil)
	if n := strings.Count(buf.String(), "level=ERROR"); n != 2 {
		t.Fatalf("a new cause was not logged at once:\n%s", buf.String())
	}
	// After the window, the next one is logged with what was held back.
	now = now.Add(10 * time.Second)
	logger.Error("Handler returned error", storeErr(2000), nil)
	if !strings.Contains(buf.String(), "repeats=999") {
		t.Fatalf("the line after the window does not count the 999 held back:\n%s", buf.String())
	}
	logger.Error("Handler returned error", storeErr(2001), nil)
	buf.Reset()
	in.flush(&buf)
	if got := buf.String(); !strings.Contains(got, `1 more "Handler returned error" errors`) {
		t.Fatalf("flush = %q; want the one held back", got)
	}
	buf.Reset()
	in.flush(&buf)
	if buf.Len() != 0 {
		t.Fatalf("a second flush repeats: %q", buf.String())
	}
}
