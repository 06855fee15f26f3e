package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/prommetrics"
)

// tally counts the middleware's outcomes for the summary and passes them
// on to Prometheus.
type tally struct {
	next      dedup.Metrics
	outcomes  [32]atomic.Int64
	onObserve func(dedup.Outcome) // each outcome, for a consumer process's report; nil: none
}

var _ dedup.Metrics = (*tally)(nil)

func (t *tally) Observe(scope string, o dedup.Outcome) {
	if int(o) < len(t.outcomes) {
		t.outcomes[o].Add(1)
	}
	if t.onObserve != nil {
		t.onObserve(o)
	}
	t.next.Observe(scope, o)
}

func (t *tally) ObserveStore(scope, op string, d time.Duration, err error) {
	t.next.ObserveStore(scope, op, d, err)
}

func (t *tally) count(o dedup.Outcome) int64 {
	if int(o) < len(t.outcomes) {
		return t.outcomes[o].Load()
	}
	return 0
}

// newMetrics returns the registry the example serves: the dedup
// middleware's metrics (prommetrics) plus the Go runtime and process
// collectors.
func newMetrics() (*prometheus.Registry, *tally, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := prommetrics.New(prommetrics.Config{Registerer: reg, Scopes: []string{handlerName}})
	if err != nil {
		return nil, nil, err
	}
	return reg, &tally{next: pm}, nil
}

// metricsServer serves /metrics until Close.
type metricsServer struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

func serveMetrics(addr string, reg *prometheus.Registry) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot serve metrics on %s (change -metrics-addr): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	m := &metricsServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(ln) // returns http.ErrServerClosed after Shutdown
	}()
	return m, nil
}

func (m *metricsServer) Close(ctx context.Context) error {
	err := m.srv.Shutdown(ctx)
	if err != nil {
		_ = m.srv.Close()
	}
	<-m.done
	return err
}

// progress shows how many of the published messages were acked, on a
// terminal only.
type progress interface {
	advance()
	finish()
}

type noProgress struct{}

func (noProgress) advance() {}
func (noProgress) finish()  {}

type barProgress struct{ bar *progressbar.ProgressBar }

func (p barProgress) advance() { _ = p.bar.Add(1) }
func (p barProgress) finish()  { _ = p.bar.Finish() }

func newProgress(w io.Writer, total int) progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return noProgress{}
	}
	return barProgress{progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("awarding loyalty points"),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("msg"),
		progressbar.OptionShowIts(),
		progressbar.OptionThrottle(50*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// newLogger logs warnings and errors to w, an error line a kind and
// incident window (see incidents); -v adds info messages, among them every
// injected fault.
func newLogger(w io.Writer, verbose bool, in *incidents) watermill.LoggerAdapter {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	return slogLogger{slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), in}
}

// slogLogger is watermill.NewSlogLogger with two differences. An error
// without an error value (the middleware's ttl miss) has no error=<nil>.
// The router's "Handler returned error" for the faults the simulation
// injects, for ErrInProgress (a retryable nack) and for the queries the
// shutdown cancels is logged at info level: they are the point of the
// demo, not errors. Every other error line passes incidents first: one
// kind of error is logged once a window while it lasts, with the count of
// those held back (repeats); a fail-open bypass, which names keys to
// reconcile, is logged every time.
type slogLogger struct {
	l         *slog.Logger
	incidents *incidents
}

func (g slogLogger) Error(msg string, err error, fields watermill.LogFields) {
	args := slogArgs(fields)
	switch {
	case err == nil:
		g.l.Error(msg, args...)
	case errors.Is(err, errInjected) || errors.Is(err, dedup.ErrInProgress) || errors.Is(err, context.Canceled):
		g.l.Info(msg+" (expected): "+err.Error(), args...)
	case strings.Contains(msg, "UNPROTECTED (fail-open)"):
		// A fail-open bypass names the keys of a message that ran without
		// protection: the operator reconciles each, so none is held back.
		g.l.Error(msg, append(args, "error", err)...)
	default:
		log, held := g.incidents.admit(msg, err)
		if !log {
			return
		}
		if held > 0 {
			args = append(args, "repeats", held)
		}
		g.l.Error(msg, append(args, "error", err)...)
	}
}

func (g slogLogger) Info(msg string, fields watermill.LogFields) {
	g.l.Info(msg, slogArgs(fields)...)
}

func (g slogLogger) Debug(msg string, fields watermill.LogFields) {
	g.l.Debug(msg, slogArgs(fields)...)
}

func (g slogLogger) Trace(msg string, fields watermill.LogFields) {
	g.l.Log(context.Background(), watermill.LevelTrace, msg, slogArgs(fields)...)
}

func (g slogLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return slogLogger{g.l.With(slogArgs(fields)...), g.incidents}
}

func slogArgs(fields watermill.LogFields) []any {
	args := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		args = append(args, k, v)
	}
	return args
}
