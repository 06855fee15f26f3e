package otelmetrics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	dedup "github.com/watermill-dedup/dedup"
)

// Instrument names, units and attribute keys.
const (
	OutcomesName      = "dedup.outcomes"
	OutcomesUnit      = "{outcome}"
	StoreDurationName = "dedup.store.operation.duration"
	StoreDurationUnit = "s"

	AttrScope     = attribute.Key("dedup.scope")
	AttrOutcome   = attribute.Key("dedup.outcome")
	AttrOperation = attribute.Key("dedup.operation")
	AttrResult    = attribute.Key("dedup.result")
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/watermill-dedup/dedup"

// Config configures Metrics. The zero value uses the global meter
// provider.
type Config struct {
	// MeterProvider makes the meter. The default is
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// Buckets are the store latency histogram's boundaries in seconds, in
	// increasing order. The default is dedup.StoreLatencyBuckets().
	Buckets []float64
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	for i := 1; i < len(c.Buckets); i++ {
		if c.Buckets[i] <= c.Buckets[i-1] {
			return fmt.Errorf("otelmetrics: Buckets must be strictly increasing, got %v at index %d after %v", c.Buckets[i], i, c.Buckets[i-1])
		}
	}
	return nil
}

// Metrics implements dedup.Metrics with OpenTelemetry instruments. It is
// safe for concurrent use.
type Metrics struct {
	outcomes metric.Int64Counter
	store    metric.Float64Histogram
}

var _ dedup.Metrics = (*Metrics)(nil)

// New creates the instruments.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if len(cfg.Buckets) == 0 {
		cfg.Buckets = dedup.StoreLatencyBuckets()
	}
	meter := cfg.MeterProvider.Meter(ScopeName)
	outcomes, err := meter.Int64Counter(OutcomesName, metric.WithUnit(OutcomesUnit),
		metric.WithDescription("Messages seen by the dedup middleware and publisher, by scope and outcome. One message can have several outcomes."))
	if err != nil {
		return nil, fmt.Errorf("otelmetrics: %s: %w", OutcomesName, err)
	}
	store, err := meter.Float64Histogram(StoreDurationName, metric.WithUnit(StoreDurationUnit),
		metric.WithDescription("Duration of dedup store calls, by scope, operation and result."),
		metric.WithExplicitBucketBoundaries(cfg.Buckets...))
	if err != nil {
		return nil, fmt.Errorf("otelmetrics: %s: %w", StoreDurationName, err)
	}
	return &Metrics{outcomes: outcomes, store: store}, nil
}

// Observe counts one outcome of a message in scope.
func (m *Metrics) Observe(scope string, o dedup.Outcome) {
	m.outcomes.Add(context.Background(), 1, metric.WithAttributes(AttrScope.String(valid(scope)), AttrOutcome.String(o.String())))
}

// ObserveStore records the duration of a store call and its result.
func (m *Metrics) ObserveStore(scope, op string, d time.Duration, err error) {
	m.store.Record(context.Background(), d.Seconds(), metric.WithAttributes(AttrScope.String(valid(scope)), AttrOperation.String(op), AttrResult.String(dedup.StoreResult(err))))
}

// valid makes s valid UTF-8, as attribute values must be.
func valid(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
