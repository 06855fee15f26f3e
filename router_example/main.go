// Command router_example is a payments -> loyalty consumer: a Watermill
// router whose handler awards loyalty points for payment.completed events,
// with the dedup middleware in front of it.
//
// This file is the router to copy into a service: the handler, Recoverer,
// a poison queue, the dedup middleware, Prometheus metrics, OpenTelemetry
// tracing (tracing.go) and a graceful shutdown. brokers.go and stores.go
// open the broker and the store that -broker and -store choose; config.go
// reads flags, environment and YAML.
// The rest of the directory is the simulator that drives the router
// through sim (simulation.go): it publishes events, injects redeliveries,
// keeps the loyalty ledger and checks it in a summary.
//
//	go run ./router_example                            # gochannel + SQLite, nothing to install
//	go run ./router_example -broker=amqp -store=redis  # RabbitMQ + Redis
//	go run ./router_example -processes=3 -kill-every=3s # 3 consumer processes, one SIGKILLed every 3s (processes.go)
//	go run ./router_example -help                      # every flag, its env variable
//
// The exit status is 0 when every payment was awarded exactly once, 1 when
// not (or the run was interrupted), 2 for a configuration error or a
// service that cannot be used (under `go run` the shell sees 1: go run
// prints "exit status 2").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/prommetrics"
)

const (
	exitOK, exitBroken, exitConfig = 0, 1, 2   // exit statuses
	handlerName                    = "loyalty" // the router handler's name, hence the dedup scope
)

func main() {
	// Graceful shutdown: SIGINT or SIGTERM cancels ctx; run then closes the
	// router, waits for the handlers running, and closes the middleware.
	// Set-up takes ctx too: a signal ends a connection attempt at once. A
	// second signal ends the process there and then (stop restores the
	// default handling).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
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
	switch {
	case cfg.Processes > 0: // the kill demo (processes.go): consumer processes of this binary consume
		return runProcesses(ctx, cfg, stdout, stderr)
	case cfg.ConsumerProcess > 0: // one of them
		return runConsumerProcess(ctx, cfg, stdout, stderr)
	}
	return runRouter(ctx, cfg, newSimulation(cfg, stdout, stderr), stderr)
}

// runRouter runs the router on the simulation sim until it is done: the
// router of a service, until it is signalled.
func runRouter(ctx context.Context, cfg Config, sim *simulation, stderr io.Writer) int {
	defer sim.close(ctx) // closes (and under -cleanup drops) what the run opened
	// go-redis logs on its own, process-wide (a failed dial): through the
	// run's logger, at info level (-v), not raw beside the errors.
	storeopen.SetRedisLogger(sim.logger)
	router, dedupMW, err := setUp(ctx, cfg, sim)
	if err != nil {
		if ctx.Err() != nil { // a signal cut the set-up short: the run did not finish
			fmt.Fprintf(stderr, "router_example: %s\n", interruption(err))
			return exitBroken
		}
		fmt.Fprintf(stderr, "router_example: %v\n", cfg.sourced(err))
		return exitConfig
	}

	routerCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	var runErr error
	stopped := make(chan struct{})
	go func() { runErr = router.Run(routerCtx); close(stopped) }()
	// A service runs until it is signalled; the simulator publishes its
	// events and returns once every one was acked (or -timeout passed).
	sim.drive(ctx, router.Running(), stopped)

	// Stop consuming, wait up to CloseTimeout for the handlers running,
	// then for the Completes ModeAsyncComplete still has in flight.
	// A router whose Run already returned (it could not subscribe) has
	// nothing to close: Close would wait CloseTimeout for handlers that
	// never started. Its own error is the reason, not the close's.
	stopRouter()
	var closeErr error
	select {
	case <-stopped:
	default:
		closeErr = router.Close()
	}
	<-stopped
	sim.routerStopped(runErr)
	sim.fail("closing the router", closeErr)
	if dedupMW != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		sim.fail("dedup middleware", dedupMW.Close(cctx))
		cancel()
	}
	if sim.report(ctx) { // the summary, and the check of the ledger
		return exitOK
	}
	return exitBroken
}

// setUp opens the broker and the store and builds the router. Every error
// is a configuration error or a service the example cannot use.
func setUp(ctx context.Context, cfg Config, sim *simulation) (*message.Router, *middleware.Middleware, error) {
	logger := sim.logger
	// Start-up check: records must outlive the broker's redeliveries.
	if err := dedup.CheckHorizon(cfg.Retention, cfg.redeliveryHorizon().d); err != nil {
		err = retentionAdvice(cfg, err)
		if cfg.StrictRetention {
			return nil, nil, fmt.Errorf("%w (-strict-retention)", err)
		}
		sim.warn(err.Error() + "; -strict-retention makes this an error")
	}

	// Prometheus: the middleware's outcomes and store latencies, plus the
	// Go runtime, on /metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := prommetrics.New(prommetrics.Config{Registerer: reg, Scopes: []string{handlerName}})
	if err != nil {
		return nil, nil, err
	}
	if cfg.MetricsAddr != "" {
		if err := sim.serveMetrics(cfg.MetricsAddr, reg); err != nil {
			return nil, nil, err
		}
	}
	// OpenTelemetry, with -trace: the handler's span, the dedup spans under it (tracing.go).
	tp, err := newTracerProvider(cfg.Trace, &sim.closers)
	if err != nil {
		return nil, nil, err
	}

	// The store first: it refuses a -run-id an earlier run left records
	// under before the broker's topics of that name are touched.
	st, err := openStore(ctx, cfg, sim.runID, logger, &sim.closers, &sim.removers)
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w", cfg.Store, err)
	}
	b, err := openBroker(ctx, cfg, sim.runID, logger, &sim.closers, &sim.removers)
	if err != nil {
		return nil, nil, fmt.Errorf("broker %s: %w", cfg.Broker, err)
	}
	ledger, err := sim.start(ctx, b, st) // the plan, the ledger, the injected faults
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w", cfg.Store, err)
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: routerCloseTimeout}, logger)
	if err != nil {
		return nil, nil, err
	}
	// A message no retry will fix (a malformed event, a key reused for
	// other content) goes to the poison topic instead of coming back for
	// ever; every other error nacks it for a redelivery.
	poison, err := wmw.PoisonQueueWithFilter(b.pub, b.poisonTopic, permanent)
	if err != nil {
		return nil, nil, err
	}
	// Every other error is retried in process with exponential backoff,
	// up to -retries times, before the message is nacked: a store or
	// database outage slows the consumer down instead of spinning it in a
	// nack-redelivery loop. Each retry runs the dedup middleware again, so
	// a retry after the first run recorded the message is a duplicate.
	retry := wmw.Retry{
		MaxRetries:          cfg.Retries,
		InitialInterval:     cfg.RetryBackoff,
		MaxInterval:         cfg.RetryMaxBackoff,
		Multiplier:          2,
		RandomizationFactor: 0.5, // consumers that failed together retry apart
		// A retry starts from the delivery's own context, not from one a
		// failed attempt's middleware left on the message.
		ResetContextOnRetry: true,
		// Each retry is logged through the incident filter: an outage that
		// the retries absorb still shows, as one line a kind a window.
		Logger: sim.logger,
		ShouldRetry: func(p wmw.RetryParams) bool {
			return !permanent(p.Err) && sim.retryable(p.Err)
		},
	}
	// Outermost first; sim.outer counts deliveries, bounds concurrency and
	// loses acks, sim.retries counts the attempts, sim.inner fails or
	// crashes the handler. handlerSpan starts the span the dedup
	// middleware's spans are children of.
	router.AddMiddleware(sim.outer, wmw.Recoverer, poison, sim.retries(retry.Middleware), handlerSpan(tp))

	var dedupMW *middleware.Middleware
	if cfg.Dedup { // -dedup=false shows what the duplicates do without it
		// Transactional: the ledger commits with the record.
		mode := cfg.mode()
		key, publishedAt := consumerKeys(cfg)
		dedupMW, err = middleware.New(middleware.Config{
			Store: sim.crashing(st.store),
			Mode:  mode,
			Key:   key,
			Policy: dedup.Policy{
				Lease:          cfg.Lease,
				InProgressWait: cfg.inProgressWait(),
				Retention:      cfg.Retention,
				OnStoreError:   cfg.storeErrorPolicy(),
				Logger:         logger,
				Metrics:        sim.tally(metrics),
				// nil: no spans. LinkRuns links a duplicate's, a takeover's
				// and a lost Complete's span to the run they found.
				Tracing: dedup.Tracing{Provider: tp, LinkRuns: true},
			},
			PublishedAt: publishedAt, // counts deliveries older than Retention (ttl misses)
			Fingerprint: middleware.PayloadFingerprint,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("dedup middleware: %w", err)
		}
		router.AddMiddleware(dedupMW.Middleware)
	}
	router.AddMiddleware(sim.inner)

	l := &loyalty{ledger: ledger}
	router.AddNoPublisherHandler(handlerName, b.topic, b.sub, l.awardPoints)
	return router, dedupMW, nil
}

// consumerKeys is what the middleware keys and dates a message by: two
// keys in one record, the message id (a redelivery by the broker) and the
// payment id (the producer republishing a payment under a new message id),
// and published_at for the ttl-miss check. Producers that are not
// Watermill carry them elsewhere (foreignKeys, producers.go).
func consumerKeys(cfg Config) (keyfuncs.KeyFunc, func(*message.Message) (time.Time, bool)) {
	payment := keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id"))
	if cfg.Producer == producerForeign {
		return foreignKeys(cfg, payment)
	}
	return keyfuncs.All(keyfuncs.Prefix("msg:", keyfuncs.MessageID()), payment), middleware.MetadataTime(metaPublishedAt)
}

// errBadEvent marks a message no retry will fix: the poison topic's.
var errBadEvent = errors.New("bad payment.completed event")

// permanent reports whether no retry will fix err: a bad event, or a
// message the middleware refuses for good (dedup.IsPermanent). Such a
// message goes to the poison topic at once.
func permanent(err error) bool {
	return dedup.IsPermanent(err) || errors.Is(err, errBadEvent)
}

// points is one loyalty point per whole unit of the event's amount (see
// paymentCompleted, scenario.go), read from the decimal string.
func (e paymentCompleted) points() (int64, error) {
	whole, _, _ := strings.Cut(e.Amount.String(), ".")
	p, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || p < 0 {
		return 0, fmt.Errorf("%w: amount %q", errBadEvent, e.Amount)
	}
	return p, nil
}

// loyalty is the consumer.
type loyalty struct {
	ledger ledger
}

// awardPoints is the handler: the same code for every broker, store and
// mode. It adds the payment's points to the customer's balance, which is
// not idempotent, and does nothing about duplicates: the middleware does.
// In ModeTransactional the SQL ledger writes in the record's transaction,
// found by sqlstore.TxFromContext(msg.Context()) (ledger.go).
func (l *loyalty) awardPoints(msg *message.Message) error {
	var ev paymentCompleted
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return fmt.Errorf("%w: message %s: %w", errBadEvent, messageRef(msg), err)
	}
	if ev.PaymentID == "" || ev.CustomerID == "" {
		return fmt.Errorf("%w: message %s: payment_id and customer_id are required", errBadEvent, messageRef(msg))
	}
	pts, err := ev.points()
	if err != nil {
		return fmt.Errorf("message %s: %w", messageRef(msg), err)
	}
	return l.ledger.Award(msg.Context(), award{
		EventID: ev.EventID, PaymentID: ev.PaymentID, CustomerID: ev.CustomerID,
		Points: pts, MessageUUID: messageRef(msg),
	})
}

// routerCloseTimeout bounds the router's Close: the handlers running, and
// each handler's subscriber closing. A Kafka consumer group closed during
// a rebalance waits for its JoinGroup's answer, which the broker may hold
// for the group's rebalance timeout (at most half of Sarama's 30s read
// timeout here, see kafkaSubscriberConfig): 15s was the very bound, and a
// loaded machine's consumer process missed it in the kill demo.
const routerCloseTimeout = 30 * time.Second
