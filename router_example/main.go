// Command router_example is a runnable payments -> loyalty router: a
// Watermill router whose handler awards loyalty points for payment.completed
// events, with the dedup middleware in front of it. The broker and the store
// are chosen by configuration; the handler is the same for all of them.
//
//	go run ./router_example                                  # gochannel + SQLite, nothing to install
//	go run ./router_example -broker=kafka-embedded           # Kafka protocol, in process
//	go run ./router_example -broker=amqp -store=redis        # RabbitMQ + Redis
//	go run ./router_example -broker=amqp -producer=foreign   # published with amqp091, not Watermill
//	go run ./router_example -help                            # every flag, its env variable
//
// It publishes -events payments (republishing some under new message ids,
// like a retrying producer) with Watermill's publisher, or with the
// broker's own client under -producer=foreign (a producer that is not
// Watermill), injects redeliveries (transient failures, lost acks,
// optionally crashes), then prints a summary and checks the invariant:
// every payment awarded exactly once. The exit status is 0 when the
// invariant holds, 1 when it does not, 2 for a configuration error or an
// unreachable service.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// Exit statuses.
const (
	exitOK     = 0
	exitBroken = 1
	exitConfig = 2
)

// handlerName is the router handler's name, hence the dedup scope.
const handlerName = "loyalty"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, err := loadConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "router_example: %v\n", err)
		return exitConfig
	}
	a := &app{cfg: cfg, runID: cfg.RunID, stdout: stdout, stderr: stderr, logger: newLogger(stderr, cfg.Verbose)}
	if a.runID == "" {
		a.runID = newRunID()
	}
	defer func() {
		if err := a.closers.run(context.WithoutCancel(ctx), 15*time.Second); err != nil {
			fmt.Fprintf(stderr, "router_example: closing: %v\n", err)
		}
	}()

	if err := a.setup(ctx); err != nil {
		fmt.Fprintf(stderr, "router_example: %v\n", err)
		a.removeCreated(ctx)
		return exitConfig
	}
	res := a.run(ctx)
	res.print(stdout)
	a.removeCreated(ctx)
	a.linger(ctx)
	if res.verdict().ok {
		return exitOK
	}
	return exitBroken
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// app is one run of the example.
type app struct {
	cfg    Config
	runID  string
	stdout io.Writer
	stderr io.Writer
	logger watermill.LoggerAdapter

	// closers close what the run opened, always; removers drop what it
	// created on shared services, under -cleanup.
	closers, removers teardown

	retention retentionCheck
	registry  *prometheus.Registry
	tally     *tally
	metrics   *metricsServer
	broker    *broker
	store     *dedupStore
	ledger    ledger
	plan      plan
	faults    *faults
	tracker   *tracker
	progress  progress
	router    *message.Router
	dedup     *middleware.Middleware // nil with -dedup=false
	keying    keying
}

func (a *app) setup(ctx context.Context) error {
	cfg := a.cfg
	if err := a.checkRetention(); err != nil {
		return err
	}
	var err error
	if a.registry, a.tally, err = newMetrics(); err != nil {
		return err
	}
	if cfg.MetricsAddr != "" {
		if a.metrics, err = serveMetrics(cfg.MetricsAddr, a.registry); err != nil {
			return err
		}
		a.closers.add("stop the metrics server", a.metrics.Close)
		fmt.Fprintf(a.stderr, "router_example: serving metrics at http://%s/metrics\n", a.metrics.addr)
	}
	if a.broker, err = openBroker(ctx, cfg, a.runID, a.logger, &a.closers, &a.removers); err != nil {
		return fmt.Errorf("broker %s: %w", cfg.Broker, err)
	}
	if a.store, err = openStore(ctx, cfg, a.runID, a.logger, &a.closers, &a.removers); err != nil {
		return fmt.Errorf("store %s: %w", cfg.Store, err)
	}
	if a.store.db != nil {
		removers := &a.removers
		if a.store.ephemeral {
			removers = &teardown{}
		}
		if a.ledger, err = newSQLLedger(ctx, a.store.db, a.store.dialect, a.runID, removers); err != nil {
			return fmt.Errorf("store %s: %w", cfg.Store, err)
		}
	} else {
		a.ledger = newMemLedger()
	}
	a.plan = makePlan(cfg, a.runID, time.Now())
	a.progress = newProgress(a.stdout, len(a.plan.messages))
	a.tracker = newTracker(a.progress.advance)
	return a.buildRouter()
}

// checkRetention surfaces the retention-window rule (window >= 1.3 x
// redelivery horizon) at
// start-up (middleware.CheckRetention's rule): a warning, or an error under
// -strict-retention.
func (a *app) checkRetention() error {
	a.retention = a.cfg.retentionCheck()
	if a.retention.ok() {
		return nil
	}
	msg := fmt.Sprintf("the dedup window is too short: %s. A redelivery arriving after the window runs the handler again (counted as ttl_miss). Raise -retention, or correct the horizon (-redelivery-horizon, -kafka-group-recovery, -outage-budget)", a.retention.detail())
	if a.cfg.StrictRetention {
		return &retentionError{msg}
	}
	fmt.Fprintf(a.stderr, "router_example: WARNING: %s; -strict-retention makes this an error.\n", msg)
	return nil
}

// retentionError is the start-up failure under -strict-retention; it wraps
// middleware.ErrRetentionTooShort.
type retentionError struct{ msg string }

func (e *retentionError) Error() string { return e.msg + " (-strict-retention)" }
func (e *retentionError) Unwrap() error { return middleware.ErrRetentionTooShort }

// buildRouter wires the router: tracking, recovery, the poison queue, the
// dedup middleware and the handler.
func (a *app) buildRouter() error {
	cfg := a.cfg
	var (
		store   = a.store.store
		abandon func(*stores.Claim)
	)
	if cfg.CrashRate > 0 && cfg.mode() == modeLease {
		cs := newCrashStore(store)
		store, abandon = cs, cs.abandon
	}
	a.faults = newFaults(cfg, abandon)
	a.keying = consumerKeying(cfg)

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, a.logger)
	if err != nil {
		return err
	}
	a.router = router
	poison, err := wmw.PoisonQueueWithFilter(a.broker.pub, a.broker.poisonTopic, a.tracker.poison)
	if err != nil {
		return err
	}
	// Outermost first. The dedup middleware is innermost but for the
	// injected failures and crashes, which happen while a message is
	// claimed; a lost ack happens after it was recorded done.
	router.AddMiddleware(a.tracker.middleware, limit(cfg.Concurrency), wmw.Recoverer, poison, a.faults.outer)
	if cfg.Dedup {
		policy, _ := cfg.storeErrorPolicy()
		mode := middleware.ModeLease
		switch {
		case cfg.mode() == modeTransactional:
			mode = middleware.ModeTransactional
		case cfg.AsyncComplete:
			mode = middleware.ModeAsyncComplete
		}
		dedup, err := middleware.New(middleware.Config{
			Store: store,
			Mode:  mode,
			// Two keys in one record: the message's own (catches broker
			// redeliveries) and the payment id (a producer republishing
			// the same payment under a new message id). Which key is the
			// message's own depends on who published it: consumerKeying.
			Key:            a.keying.key,
			Lease:          cfg.Lease,
			InProgressWait: cfg.inProgressWait(),
			Retention:      cfg.Retention,
			PublishedAt:    a.keying.publishedAt,
			OnStoreError:   policy,
			Fingerprint:    middleware.PayloadFingerprint,
			Logger:         a.logger,
			Metrics:        a.tally,
		})
		if err != nil {
			return fmt.Errorf("dedup middleware: %w", err)
		}
		a.dedup = dedup
		router.AddMiddleware(dedup.Middleware)
	}
	router.AddMiddleware(a.faults.inner)

	l := &loyalty{ledger: a.ledger}
	router.AddNoPublisherHandler(handlerName, a.broker.topic, a.broker.sub, l.awardPoints)
	return nil
}

// run starts the router, publishes the plan and waits until every message
// was acked, -timeout passes or the process is interrupted.
func (a *app) run(ctx context.Context) *result {
	start := time.Now()
	res := &result{
		cfg: a.cfg, runID: a.runID, mode: a.cfg.mode(), topic: a.broker.topic,
		broker: a.broker.addr, store: a.store.addr, retention: a.retention,
		plan: a.plan, outcome: a.tally.count,
		producer: a.broker.producerText, keys: a.keying.text,
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	routerDone := make(chan error, 1)
	go func() { routerDone <- a.router.Run(runCtx) }()
	select {
	case <-a.router.Running():
	case err := <-routerDone:
		res.runErr = fmt.Errorf("the router stopped before it ran: %w", err)
		return res
	}

	type published struct {
		failures int
		err      error
	}
	publishDone := make(chan published, 1)
	go func() {
		n, err := publishAll(runCtx, a.broker.producer, a.broker.topic, a.plan, a.tracker)
		publishDone <- published{n, err}
	}()

	timeout := time.NewTimer(a.cfg.Timeout)
	defer timeout.Stop()
	pubResult := published{err: errors.New("not finished")}
	pubFinished := false
	for waiting := true; waiting; {
		select {
		case <-a.tracker.done:
			res.finished = true
			waiting = false
		case p := <-publishDone:
			pubResult, pubFinished = p, true
			if p.err != nil {
				res.runErr = p.err
				waiting = false
			}
			publishDone = nil // received; wait for the acks
		case <-timeout.C:
			waiting = false
		case <-ctx.Done():
			res.runErr = errors.New("interrupted")
			waiting = false
		}
	}
	if res.finished {
		a.waitDrained(ctx)
	}
	cancel()
	if !pubFinished {
		pubResult = <-publishDone
	}
	res.publishFailures = pubResult.failures
	if err := a.router.Close(); err != nil {
		a.logger.Error("Closing the router", err, nil)
	}
	if err := <-routerDone; err != nil && res.runErr == nil {
		res.runErr = fmt.Errorf("router: %w", err)
	}
	if a.dedup != nil {
		// With -async-complete, the Completes still in flight land now.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		if err := a.dedup.Close(cctx); err != nil && res.runErr == nil {
			res.runErr = fmt.Errorf("dedup middleware: %w", err)
		}
		ccancel()
	}
	a.progress.finish()
	res.elapsed = time.Since(start)

	res.stats = a.tracker.stats()
	res.published = a.tracker.expectedCount()
	res.failures, res.crashes, res.lostAcks = a.faults.counts()
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer lcancel()
	res.ledger, res.ledgerErr = a.ledger.Snapshot(lctx)
	return res
}

// waitDrained waits, for brokers that commit acks after the handler
// returned, until every ack is durable (see broker.drained).
func (a *app) waitDrained(ctx context.Context) {
	if a.broker.drained == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := a.broker.drained(ctx)
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			a.logger.Error("The broker did not record every ack in time: the last messages may come again on the next start", err, nil)
			return
		case <-tick.C:
		}
	}
}

// removeCreated drops, under -cleanup, what the run created on shared
// services; without it, says what was kept.
func (a *app) removeCreated(ctx context.Context) {
	if len(a.removers.steps) == 0 {
		return
	}
	if !a.cfg.Cleanup {
		fmt.Fprintf(a.stderr, "router_example: kept for inspection (run with -cleanup to remove): %s\n", strings.Join(a.removers.names(), "; "))
		return
	}
	if err := a.removers.run(context.WithoutCancel(ctx), 30*time.Second); err != nil {
		fmt.Fprintf(a.stderr, "router_example: cleanup: %v\n", err)
	}
}

// linger keeps the metrics endpoint up after the summary for -linger, or
// until interrupted.
func (a *app) linger(ctx context.Context) {
	if a.metrics == nil || a.cfg.Linger <= 0 {
		return
	}
	fmt.Fprintf(a.stderr, "router_example: metrics stay at http://%s/metrics for %s (Ctrl-C to stop)\n", a.metrics.addr, a.cfg.Linger)
	t := time.NewTimer(a.cfg.Linger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
