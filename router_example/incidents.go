package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// incidentWindow is how often one kind of error is logged while it keeps
// happening: a store outage under a busy consumer fails every delivery,
// and is one incident, not one line a delivery.
const incidentWindow = 10 * time.Second

// incidents decides which error lines are logged: the first of a kind at
// once, then at most one a window, carrying the count of those it held
// back. A kind is the log message with the error's cause (see
// incidentKey), so errors that differ only by message id are one kind.
type incidents struct {
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*incident
}

type incident struct {
	msg    string
	logged time.Time // when a line of this kind was last logged
	held   int       // lines held back since then
}

func newIncidents(window time.Duration, now func() time.Time) *incidents {
	return &incidents{window: window, now: now, kinds: map[string]*incident{}}
}

// admit reports whether the error line (msg, err) is to be logged, and
// how many of its kind were held back since the last one that was.
func (in *incidents) admit(msg string, err error) (log bool, held int) {
	key := incidentKey(msg, err)
	now := in.now()
	in.mu.Lock()
	defer in.mu.Unlock()
	k, ok := in.kinds[key]
	if !ok {
		in.kinds[key] = &incident{msg: msg, logged: now}
		return true, 0
	}
	if now.Sub(k.logged) < in.window {
		k.held++
		return false, 0
	}
	held, k.held, k.logged = k.held, 0, now
	return true, held
}

// flush writes a line for each kind with lines still held back, for the
// end of a run: nothing is dropped without a word.
func (in *incidents) flush(w io.Writer) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var lines []string
	for _, k := range in.kinds {
		if k.held > 0 {
			lines = append(lines, fmt.Sprintf("router_example: %d more %q errors since the last one logged (one line each %s a kind)", k.held, k.msg, in.window))
			k.held = 0
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// incidentKey is the kind of an error line: its message, and the error's
// class and root cause, without the message id and key the wrapping adds.
func incidentKey(msg string, err error) string {
	class := "error"
	if errors.Is(err, dedup.ErrStore) {
		class = "store"
	}
	return msg + "\x00" + class + "\x00" + rootCause(err).Error()
}

// rootCause follows err's chain to its end; where an error wraps several,
// the last (the cause, after the sentinels that class it).
func rootCause(err error) error {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next := u.Unwrap()
			if next == nil {
				return err
			}
			err = next
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			if len(errs) == 0 {
				return err
			}
			err = errs[len(errs)-1]
		default:
			return err
		}
	}
}
