package cycle

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Beat's Detached context keeps its parent's values and hides its
// cancellation, deadline and cause.
func TestDetached(t *testing.T) {
	type k struct{}
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), k{}, "v"))
	parent, stopDeadline := context.WithTimeout(parent, time.Hour)
	defer stopDeadline()
	e := &Beat{parent: parent}
	d := e.Detached()
	cancel(errors.New("gone"))
	if d.Err() != nil || d.Done() != nil || context.Cause(d) != nil {
		t.Fatalf("detached: Err %v, Done %v, Cause %v; want none", d.Err(), d.Done(), context.Cause(d))
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached has a deadline")
	}
	if d.Value(k{}) != "v" {
		t.Fatalf("detached lost the parent's value: %v", d.Value(k{}))
	}
	// A context derived from it is cancelled by itself only.
	child, stop := context.WithTimeout(d, time.Hour)
	defer stop()
	if child.Err() != nil {
		t.Fatalf("child of detached: %v", child.Err())
	}
	stop()
	if !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("child of detached after its cancel: %v", child.Err())
	}
}
