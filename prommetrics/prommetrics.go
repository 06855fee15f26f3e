package prommetrics

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	dedup "github.com/watermill-dedup/dedup"
)

// Default values of Config fields.
const DefaultNamespace = "dedup"

// Metric and label names, without the namespace.
const (
	OutcomesName      = "outcomes_total"
	StoreDurationName = "store_duration_seconds"

	LabelScope   = "scope"
	LabelOutcome = "outcome"
	LabelOp      = "op"
	LabelResult  = "result"
)

// Config configures Metrics. The zero value registers with
// prometheus.DefaultRegisterer under the "dedup" namespace.
type Config struct {
	// Registerer receives the collectors. The default is
	// prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer

	// Namespace and Subsystem prefix the metric names
	// (namespace_subsystem_outcomes_total). The default Namespace is
	// "dedup"; Subsystem is empty by default.
	Namespace string
	Subsystem string

	// ConstLabels are added to every series, such as {"service": "loyalty"}.
	ConstLabels prometheus.Labels

	// Buckets are the store latency histogram's upper bounds in seconds, in
	// increasing order. The default is dedup.StoreLatencyBuckets().
	Buckets []float64

	// Scopes whose outcome series are created at zero by New. Other scopes
	// get theirs when first observed.
	Scopes []string
}

var nameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Namespace != "" && !nameRE.MatchString(c.Namespace) {
		return fmt.Errorf("prommetrics: Namespace must match %s, got %q", nameRE, c.Namespace)
	}
	if c.Subsystem != "" && !nameRE.MatchString(c.Subsystem) {
		return fmt.Errorf("prommetrics: Subsystem must match %s, got %q", nameRE, c.Subsystem)
	}
	for i := 1; i < len(c.Buckets); i++ {
		if c.Buckets[i] <= c.Buckets[i-1] {
			return fmt.Errorf("prommetrics: Buckets must be strictly increasing, got %v at index %d after %v", c.Buckets[i], i, c.Buckets[i-1])
		}
	}
	return nil
}

// Metrics implements dedup.Metrics with Prometheus collectors. It is
// safe for concurrent use.
type Metrics struct {
	outcomes *prometheus.CounterVec
	store    *prometheus.HistogramVec
	seen     sync.Map // scope -> struct{}: scopes whose outcome series exist
}

var _ dedup.Metrics = (*Metrics)(nil)

// New creates the collectors and registers them with cfg.Registerer. It
// fails when the config is invalid or the registration fails, for example
// because the registry already holds these metrics (errors.As finds a
// prometheus.AlreadyRegisteredError then): share one Metrics per registry.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.DefaultRegisterer
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if len(cfg.Buckets) == 0 {
		cfg.Buckets = dedup.StoreLatencyBuckets()
	}
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   cfg.Subsystem,
			Name:        OutcomesName,
			Help:        "Messages seen by the dedup middleware and publisher, by scope and outcome. One message can have several outcomes.",
			ConstLabels: cfg.ConstLabels,
		}, []string{LabelScope, LabelOutcome}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   cfg.Subsystem,
			Name:        StoreDurationName,
			Help:        "Duration of dedup store calls, by scope, operation (claim, complete, release, extend, begin, commit, rollback) and result (ok, error, lost_claim, invalid).",
			ConstLabels: cfg.ConstLabels,
			Buckets:     cfg.Buckets,
		}, []string{LabelScope, LabelOp, LabelResult}),
	}
	if err := cfg.Registerer.Register(m.outcomes); err != nil {
		return nil, fmt.Errorf("prommetrics: register %s: %w", OutcomesName, err)
	}
	if err := cfg.Registerer.Register(m.store); err != nil {
		cfg.Registerer.Unregister(m.outcomes)
		return nil, fmt.Errorf("prommetrics: register %s: %w", StoreDurationName, err)
	}
	for _, s := range cfg.Scopes {
		m.ensureScope(labelValue(s))
	}
	return m, nil
}

// Observe counts one outcome of a message in scope.
func (m *Metrics) Observe(scope string, o dedup.Outcome) {
	scope = labelValue(scope)
	m.ensureScope(scope)
	m.outcomes.WithLabelValues(scope, o.String()).Inc()
}

// ObserveStore records the duration of a store call and its result.
func (m *Metrics) ObserveStore(scope, op string, d time.Duration, err error) {
	m.store.WithLabelValues(labelValue(scope), labelValue(op), dedup.StoreResult(err)).Observe(d.Seconds())
}

// ensureScope creates every outcome series of scope at zero, once.
func (m *Metrics) ensureScope(scope string) {
	if _, ok := m.seen.Load(scope); ok {
		return
	}
	if _, loaded := m.seen.LoadOrStore(scope, struct{}{}); loaded {
		return
	}
	for _, o := range dedup.Outcomes() {
		m.outcomes.WithLabelValues(scope, o.String())
	}
}

// labelValue makes s a valid label value: the client panics on invalid
// UTF-8, and a metrics hook must never take a consumer down.
func labelValue(s string) string {
	return strings.ToValidUTF8(s, "\uFFFD")
}
