package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/stores"
)

// simulation drives the router of main.go and checks what it did: it
// publishes the plan's events (plan, producers.go), injects redeliveries
// around the handler (faults), follows every delivery (tracker), keeps the
// loyalty ledger (ledger.go) and prints the summary (summary.go). main.go
// reaches it through a few methods: start, crashing, tally, outer,
// retries, retryable, inner, drive, report and close.
type simulation struct {
	cfg    Config
	runID  string
	stdout io.Writer
	stderr io.Writer
	logger watermill.LoggerAdapter
	// incidents holds back error lines of a kind already logged (see
	// newLogger); report says how many.
	incidents *incidents

	// closers close what the run opened, always; removers drop what it
	// created on shared services, under -cleanup.
	closers, removers teardown

	metricsAddr string // "" when -metrics-addr is not set
	counts      *tally
	broker      *broker
	store       *dedupStore
	ledger      ledger
	plan        plan
	faults      *faults
	tracker     *tracker
	limit       message.HandlerMiddleware
	progress    progress
	res         *result
	ran         bool // the router ran: the run has something to inspect
	removed     bool
	handlerRuns atomic.Int64 // calls of the handler, for the summary
	calls       atomic.Int64 // deliveries that reached the retry middleware
	attempts    atomic.Int64 // and the attempts it made of them

	// child reports the deliveries of a consumer process of -processes
	// to its parent (processes.go); nil otherwise.
	child *reporter
}

func newSimulation(cfg Config, stdout, stderr io.Writer) *simulation {
	s := &simulation{
		cfg: cfg, runID: cfg.RunID, stdout: stdout, stderr: stderr,
		incidents: newIncidents(incidentWindow, time.Now),
		counts:    &tally{next: dedup.NopMetrics{}},
	}
	s.logger = newLogger(stderr, cfg.Verbose, s.incidents)
	if s.runID == "" {
		s.runID = newRunID()
	}
	s.res = &result{
		cfg: cfg, runID: s.runID, mode: cfg.mode(), retention: cfg.retentionCheck(),
		outcome: s.counts.count, keys: keysText(cfg),
	}
	for _, w := range cfg.warnings() {
		s.warn(w)
	}
	return s
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// warn prints a warning on stderr.
func (s *simulation) warn(msg string) {
	if s.cfg.ConsumerProcess > 0 {
		return // the parent, on the same settings, said it
	}
	fmt.Fprintf(s.stderr, "router_example: WARNING: %s.\n", msg)
}

// serveMetrics serves reg on /metrics at addr until the run is closed.
func (s *simulation) serveMetrics(addr string, reg *prometheus.Registry) error {
	m, err := serveMetrics(addr, reg)
	if err != nil {
		return err
	}
	s.closers.add("stop the metrics server", m.Close)
	s.metricsAddr = m.addr
	fmt.Fprintf(s.stderr, "router_example: serving metrics at http://%s/metrics\n", m.addr)
	return nil
}

// start makes the plan, the ledger the handler writes to (in the SQL
// store's database, or in memory), the tracker and the faults.
func (s *simulation) start(ctx context.Context, b *broker, st *dedupStore) (ledger, error) {
	s.broker, s.store = b, st
	s.res.topic, s.res.broker, s.res.store, s.res.producer = b.topic, b.addr, st.addr, b.producerText
	if st.db != nil {
		removers := &s.removers
		if st.ephemeral {
			removers = &teardown{}
		}
		l, err := newSQLLedger(ctx, st.db, st.dialect, s.runID, removers)
		if err != nil {
			return nil, fmt.Errorf("the ledger: %w", err)
		}
		s.ledger = l
	} else {
		s.ledger = newMemLedger()
	}
	s.plan = makePlan(s.cfg, s.runID, time.Now())
	s.res.plan = s.plan
	s.progress = newProgress(s.stdout, len(s.plan.messages))
	s.tracker = newTracker(s.progress.advance)
	s.faults = newFaults(s.cfg, nil)
	s.limit = limit(s.cfg.Concurrency)
	if s.child != nil {
		s.counts.onObserve, s.faults.onCount = s.child.outcome, s.child.fault
	}
	return s.ledger, nil
}

// crashing is the store as a consumer that crashes sees it, in lease mode
// under -crash-rate (see crashStore); store itself otherwise.
func (s *simulation) crashing(store stores.Store) stores.Store {
	if s.cfg.CrashRate <= 0 || s.cfg.mode() == dedup.ModeTransactional {
		return store
	}
	cs := newCrashStore(store)
	s.faults.abandon = cs.abandon
	return cs
}

// tally counts the middleware's outcomes for the summary and passes them
// on to next.
func (s *simulation) tally(next dedup.Metrics) dedup.Metrics {
	s.counts.next = next
	return s.counts
}

// outer is the outermost router middleware: it follows every delivery,
// bounds how many run at once, and loses acks of handled messages.
func (s *simulation) outer(h message.HandlerFunc) message.HandlerFunc {
	h = s.tracker.middleware(s.limit(s.faults.outer(h)))
	if s.child != nil {
		h = s.child.middleware(h)
	}
	return h
}

// retries wraps the router's retry middleware and counts its attempts:
// every attempt after a delivery's first is a retry in process.
func (s *simulation) retries(retry message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		attempt := retry(func(msg *message.Message) ([]*message.Message, error) {
			s.attempts.Add(1)
			if s.child != nil {
				s.child.send(report{Kind: reportAttempt})
			}
			return h(msg)
		})
		return func(msg *message.Message) ([]*message.Message, error) {
			s.calls.Add(1)
			if s.child != nil {
				s.child.send(report{Kind: reportCall})
			}
			return attempt(msg)
		}
	}
}

// retryable reports whether the router may retry err in process: not
// after an injected crash, since a consumer that died retries nothing
// (its message comes back from the broker).
func (s *simulation) retryable(err error) bool {
	return !errors.Is(err, errInjectedCrash)
}

// inner wraps the handler, inside the dedup middleware: it fails it before
// its side effect, or crashes it after, and counts its calls.
func (s *simulation) inner(h message.HandlerFunc) message.HandlerFunc {
	return s.faults.inner(func(msg *message.Message) ([]*message.Message, error) {
		s.handlerRuns.Add(1)
		if s.child != nil {
			s.child.ran(msg)
		}
		return h(msg)
	})
}

// fail records err: the first failure of the run is the summary's reason,
// and every one is said on stderr, so that none is lost behind another.
func (s *simulation) fail(what string, err error) {
	if err == nil {
		return
	}
	err = fmt.Errorf("%s: %w", what, err)
	fmt.Fprintf(s.stderr, "router_example: %v\n", err)
	if s.res.runErr == nil {
		s.res.runErr = err
	}
}

// routerStopped records how the router's Run ended: its error, or, when
// it stopped before it ran without one, that.
func (s *simulation) routerStopped(err error) {
	if err == nil && !s.ran && s.res.runErr == nil {
		err = errors.New("it stopped before it ran")
	}
	s.fail("router", err)
}

// drive waits for the router to run, publishes the plan and waits until
// every message was acked, -timeout passes or ctx ends. stopped closes
// when the router stopped.
func (s *simulation) drive(ctx context.Context, running, stopped <-chan struct{}) {
	if s.child != nil {
		s.driveConsumer(ctx, running, stopped)
		return
	}
	start := time.Now()
	defer func() { s.res.elapsed = time.Since(start) }()
	select {
	case <-running:
		s.ran = true
	case <-stopped: // the router's error is the reason (routerStopped)
		return
	case <-ctx.Done():
		s.fail("run", errors.New("interrupted"))
		return
	}
	fmt.Fprintf(s.stderr, "router_example: run %s (seed %d): broker %s, store %s, mode %s%s; publishing %d messages of %d events\n",
		s.runID, s.cfg.Seed, s.cfg.Broker, s.cfg.Store, modeText(s.cfg), producerNote(s.cfg), len(s.plan.messages), s.plan.events)

	pctx, cancel := context.WithCancel(ctx)
	type published struct {
		failures int
		err      error
	}
	publishDone := make(chan published, 1)
	go func() {
		n, err := publishAll(pctx, s.broker.producer, s.broker.topic, s.plan, s.tracker)
		publishDone <- published{n, err}
	}()
	defer func() {
		cancel()
		if publishDone != nil {
			s.res.publishFailures = (<-publishDone).failures
		}
	}()

	timeout := time.NewTimer(s.cfg.Timeout)
	defer timeout.Stop()
	for {
		select {
		case <-s.tracker.done:
			s.res.finished = true
			s.waitDrained(ctx)
			return
		case p := <-publishDone:
			publishDone = nil // received; wait for the acks
			s.res.publishFailures = p.failures
			if p.err != nil {
				s.fail("publish", p.err)
				return
			}
		case <-timeout.C:
			return
		case <-ctx.Done():
			s.fail("run", errors.New("interrupted"))
			return
		}
	}
}

// waitDrained waits, for brokers that commit acks after the handler
// returned, until every ack is durable (see broker.drained).
func (s *simulation) waitDrained(ctx context.Context) {
	if s.broker.drained == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := s.broker.drained(ctx)
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			s.logger.Error("The broker did not record every ack in time: the last messages may come again on the next start", err, nil)
			return
		case <-tick.C:
		}
	}
}

// report prints the summary, drops what the run created under -cleanup,
// lingers for -linger, and reports whether the invariant holds.
func (s *simulation) report(ctx context.Context) bool {
	if s.child != nil {
		return s.reportConsumer()
	}
	s.progress.finish()
	res := s.res
	res.stats = s.tracker.stats()
	res.published = s.tracker.expectedCount()
	res.failures, res.crashes, res.lostAcks = s.faults.counts()
	res.handlerRuns = s.handlerRuns.Load()
	res.retries = s.attempts.Load() - s.calls.Load()
	if s.broker != nil && s.broker.brokerDedup != nil {
		res.brokerDup = s.broker.brokerDedup()
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	res.ledger, res.ledgerErr = s.ledger.Snapshot(lctx)
	cancel()
	s.incidents.flush(s.stderr)
	res.print(s.stdout)
	s.removeCreated(ctx)
	s.linger(ctx)
	return res.verdict().ok
}

// close drops what the run created (under -cleanup) and closes what it
// opened, newest first.
func (s *simulation) close(ctx context.Context) {
	s.removeCreated(ctx)
	if err := s.closers.run(context.WithoutCancel(ctx), 15*time.Second); err != nil {
		fmt.Fprintf(s.stderr, "router_example: closing: %v\n", err)
	}
}

// removeCreated drops, under -cleanup, what the run created on shared
// services; without it, says what was kept.
func (s *simulation) removeCreated(ctx context.Context) {
	// A consumer process's parent removes them.
	if s.removed || len(s.removers.steps) == 0 || s.child != nil {
		return
	}
	s.removed = true
	if !s.cfg.Cleanup {
		// A run that never ran created nothing worth a word: empty
		// topics and tables at most.
		if s.ran {
			fmt.Fprintf(s.stderr, "router_example: kept for inspection (run with -cleanup to remove): %s\n", strings.Join(s.removers.names(), "; "))
		}
		return
	}
	if err := s.removers.run(context.WithoutCancel(ctx), 30*time.Second); err != nil {
		fmt.Fprintf(s.stderr, "router_example: cleanup: %v\n", err)
	}
}

// linger keeps the metrics endpoint up after the summary for -linger, or
// until interrupted.
func (s *simulation) linger(ctx context.Context) {
	if s.metricsAddr == "" || s.cfg.Linger <= 0 {
		return
	}
	fmt.Fprintf(s.stderr, "router_example: metrics stay at http://%s/metrics for %s (Ctrl-C to stop)\n", s.metricsAddr, s.cfg.Linger)
	t := time.NewTimer(s.cfg.Linger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
