package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
)

// teardown is a stack of named steps run in reverse order, like
// testing.T.Cleanup: what was opened last is closed first.
type teardown struct {
	steps []teardownStep
}

type teardownStep struct {
	name string
	fn   func(context.Context) error
}

func (t *teardown) add(name string, fn func(context.Context) error) {
	t.steps = append(t.steps, teardownStep{name, fn})
}

// run runs every step, newest first, even after a failure, and returns
// the failures joined. Each step is bounded by perStep.
func (t *teardown) run(ctx context.Context, perStep time.Duration) error {
	var errs []error
	for i := len(t.steps) - 1; i >= 0; i-- {
		s := t.steps[i]
		sctx, cancel := context.WithTimeout(ctx, perStep)
		if err := s.fn(sctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
		cancel()
	}
	t.steps = nil
	return errors.Join(errs...)
}

// names lists the steps, oldest first (what -cleanup would remove).
func (t *teardown) names() []string {
	out := make([]string, 0, len(t.steps))
	for _, s := range t.steps {
		out = append(out, s.name)
	}
	return out
}

// unreachable is the error of a service the example cannot use, at addr,
// which setting changes: nothing answered there, or the server refused
// and the error says which credentials to check in setting.
func unreachable(service, addr, setting string, err error) error {
	check := connect.Check // "user, password and database"
	if service == "RabbitMQ" {
		check = "user, password and virtual host"
	}
	return &storeopen.UnreachableError{Service: service, Addr: addr, Setting: setting, Check: check, Err: err}
}

// dialTimeout bounds the reachability probe of every service, and each
// connection attempt.
const dialTimeout = storeopen.DialTimeout

// redactURL hides the password of a URL for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// urlHostPort is the host:port of a URL, with the scheme's default port.
func urlHostPort(raw, defaultPort string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", fmt.Errorf("no host in %q", redactURL(raw))
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), defaultPort), nil
	}
	return u.Host, nil
}

// runIDUsedError refuses a run id whose records are still there from an
// earlier run: its dedup records would make every message of this run a
// duplicate of that run's (never handled, the ledger short: "lost"), and
// its ledger entries would count as this run's awards.
type runIDUsedError struct {
	RunID string
	What  string // what was found, and what it would do: "the Redis at ... holds that run's dedup records, ..."
}

func (e *runIDUsedError) Error() string {
	return fmt.Sprintf("-run-id %s was used before: %s. Choose another -run-id, or leave it out for a random one "+
		"(a run given -cleanup deletes what it wrote when it ends)", e.RunID, e.What)
}

// refuseUsedRunID fails with a *runIDUsedError when s, the store at
// where, holds a record: a run's store is its own (its key prefix or
// table carries the run id), so a record there is an earlier run's. Call
// it before registering the removal of what the run creates: a refused
// run deletes nothing.
func refuseUsedRunID(ctx context.Context, s stores.Store, runID, where string) error {
	a, ok := s.(stores.Admin)
	if !ok {
		return nil
	}
	recs, _, err := a.List(ctx, stores.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("look for the records of an earlier run with -run-id %s in %s: %w", runID, where, err)
	}
	if len(recs) > 0 {
		return &runIDUsedError{RunID: runID, What: where + " holds that run's dedup records, which would make this run's messages duplicates of that run's"}
	}
	return nil
}
