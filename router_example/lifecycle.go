package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	if errors.Is(err, errInterrupted) {
		return err // a signal cut it short: the service is not to blame
	}
	check := connect.Check // "user, password and database"
	if service == "RabbitMQ" {
		check = "user, password and virtual host"
	}
	return &storeopen.UnreachableError{Service: service, Addr: addr, Setting: setting, Check: check, Err: err}
}

// dialTimeout bounds the reachability probe of every service, and each
// connection attempt.
const dialTimeout = storeopen.DialTimeout

// stepTimeout bounds each set-up step a client library runs without a
// context (connecting, creating a topic): a server that stops answering
// half-way fails the set-up then, not after the library's own time-outs
// (minutes, in Sarama).
const stepTimeout = 30 * time.Second

// errInterrupted is wrapped by the error of a set-up step a signal cut
// short (SIGINT, SIGTERM: the context of run): an *interruptedError.
var errInterrupted = errors.New("interrupted")

// interruptedError is a set-up step a signal cut short.
type interruptedError struct {
	While string // what the step was doing: "waiting for Kafka at 127.0.0.1:9092 to answer"
}

func (e *interruptedError) Error() string { return "interrupted while " + e.While }

func (e *interruptedError) Is(target error) bool { return target == errInterrupted }

// interruption is what to say of a set-up that failed with err after a
// signal: what it was doing, when a step said so; a step that takes a
// context fails with its own error then (context canceled), which says
// nothing about the service.
func interruption(err error) string {
	var ie *interruptedError
	if errors.As(err, &ie) {
		return ie.Error()
	}
	return "interrupted during set-up"
}

// stepTimeoutError is a set-up step that took longer than stepTimeout.
type stepTimeoutError struct {
	Step    string
	Timeout time.Duration
}

func (e *stepTimeoutError) Error() string {
	return fmt.Sprintf("%s: no answer within %s", e.Step, e.Timeout)
}

// await runs step, a client library's call that takes no context, and
// returns what it returns; or, as soon as ctx ends (a signal), an error
// wrapping errInterrupted; or, after stepTimeout, a *stepTimeoutError. A
// step abandoned so runs on in the background, and what it returns then
// is given to discard (to close it); nothing else sees it.
func await[T any](ctx context.Context, what string, step func() (T, error), discard func(T)) (T, error) {
	return awaitWithin(ctx, stepTimeout, what, step, discard)
}

// awaitWithin is await with a time-out of its own.
func awaitWithin[T any](ctx context.Context, timeout time.Duration, what string, step func() (T, error), discard func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := step()
		done <- result{v, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		err = &interruptedError{While: what}
	case <-timer.C:
		err = &stepTimeoutError{Step: what, Timeout: timeout}
	}
	go func() {
		if r := <-done; r.err == nil && discard != nil {
			discard(r.v)
		}
	}()
	var zero T
	return zero, err
}

// awaitErr is await for a step that returns only an error.
func awaitErr(ctx context.Context, what string, step func() error) error {
	_, err := await(ctx, what, func() (struct{}, error) { return struct{}{}, step() }, nil)
	return err
}

// probeAnswer checks that a server answers at addr before a client
// library connects with its own long (or endless) waits: it connects, as
// storeopen.ProbeTCP does, sends hello, a request of the service's
// protocol that any server of it answers, and waits dialTimeout for the
// start of an answer, which answer must accept (it gets what arrived,
// probeAnswerLen bytes at the most). Nothing listening, no answer, or an
// answer of another protocol is an *storeopen.UnreachableError naming
// setting; a signal (ctx), an error wrapping errInterrupted.
func probeAnswer(ctx context.Context, service, addr, setting string, hello []byte, answer func([]byte) bool) error {
	fail := func(err error) error {
		if ctx.Err() != nil {
			return &interruptedError{While: "waiting for " + service + " at " + addr + " to answer"}
		}
		return &storeopen.UnreachableError{Service: service, Addr: addr, Setting: setting, Err: err}
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	// A signal ends the wait at once: the deadline passes.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := conn.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
		return fail(err)
	}
	if _, err := conn.Write(hello); err != nil {
		return fail(err)
	}
	var b [probeAnswerLen]byte
	// Enough to judge, or what came before the server stopped sending.
	n, err := io.ReadAtLeast(conn, b[:], probeAnswerLen)
	if n > 0 {
		if answer(b[:n]) {
			return nil
		}
		return fail(fmt.Errorf("it answered, but not as a %s server does (%q): is the address right?", service, b[:n]))
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		err = fmt.Errorf("no answer within %s (something accepts connections there, but no %s server answered)", dialTimeout, service)
	case errors.Is(err, io.EOF):
		err = fmt.Errorf("the connection was closed without an answer (is it a %s server?)", service)
	}
	return fail(err)
}

// probeAnswerLen is how much of an answer probeAnswer reads to judge it:
// a Kafka response's size and correlation id.
const probeAnswerLen = 8

// kafkaAnswer accepts the start of a Kafka response to kafkaHello: a
// plausible size, then kafkaHello's correlation id.
func kafkaAnswer(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	size := binary.BigEndian.Uint32(b)
	return size >= 4 && size <= 1<<24 && binary.BigEndian.Uint32(b[4:]) == 1
}

// amqpAnswer accepts the start of an AMQP 0-9-1 server's answer to its
// protocol header: a method frame (Connection.Start), or the header of
// the version it speaks instead.
func amqpAnswer(b []byte) bool {
	return len(b) > 0 && (b[0] == 1 || bytes.HasPrefix(b, []byte("AMQP")))
}

// kafkaHello is a Kafka ApiVersions request, version 0: every Kafka
// broker answers it, before any authentication.
func kafkaHello() []byte {
	const clientID = "router_example"
	b := binary.BigEndian.AppendUint32(nil, uint32(2+2+4+2+len(clientID))) // size
	b = binary.BigEndian.AppendUint16(b, 18)                               // api key: ApiVersions
	b = binary.BigEndian.AppendUint16(b, 0)                                // api version
	b = binary.BigEndian.AppendUint32(b, 1)                                // correlation id
	b = binary.BigEndian.AppendUint16(b, uint16(len(clientID)))
	return append(b, clientID...)
}

// amqpHello is the AMQP 0-9-1 protocol header: the server answers it with
// Connection.Start (or with the protocol header it speaks).
var amqpHello = []byte("AMQP\x00\x00\x09\x01")

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
	What  string // what was found, and what it would do: "the Redis at ... holds its dedup records"
}

func (e *runIDUsedError) Error() string {
	return fmt.Sprintf("-run-id %s was used before: %s. Choose another -run-id, or leave it out for a random one", e.RunID, e.What)
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
		return &runIDUsedError{RunID: runID, What: where + " holds its dedup records"}
	}
	return nil
}

// probeScope is the scope of the claim probeClaim makes before the run.
const probeScope = "router_example.probe"

// probeClaim claims and releases a key of the run's own in s, the store
// at where, before the router runs: a store that answers but refuses
// this user's writes (a Redis ACL user on another key prefix: NOPERM; a
// database role without INSERT) stops the run at once, naming the
// refusal, instead of failing every message until -timeout.
func probeClaim(ctx context.Context, s stores.Store, lease time.Duration, runID, where string) error {
	c, err := s.Claim(ctx, probeScope, []string{runID}, lease)
	if err == nil && c.Result == stores.Claimed {
		err = s.Release(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("%s refused a trial claim before the run: %w", where, err)
	}
	return nil
}
