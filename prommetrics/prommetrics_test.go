package prommetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/prommetrics"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

func newMetrics(t *testing.T, cfg prommetrics.Config) (*prommetrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	m, err := prommetrics.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// outcomeLines is the exposition of every outcome series of scope, with the
// given non-zero counts.
func outcomeLines(metric, scope string, counts map[string]int) string {
	var b strings.Builder
	for _, o := range dedup.Outcomes() {
		fmt.Fprintf(&b, "%s{outcome=%q,scope=%q} %d\n", metric, o.String(), scope, counts[o.String()])
	}
	return b.String()
}

// storeLines is the exposition of the store histogram series of op and
// result in scope loyalty, on the buckets 0.001 and 0.01: the calls
// under each bucket, the count of all, and their sum.
func storeLines(op, result string, under1ms, under10ms, count int, sum string) string {
	var b strings.Builder
	series := fmt.Sprintf("op=%q,result=%q,scope=%q", op, result, "loyalty")
	for _, le := range []struct {
		le string
		n  int
	}{{"0.001", under1ms}, {"0.01", under10ms}, {"+Inf", count}} {
		fmt.Fprintf(&b, "dedup_store_duration_seconds_bucket{%s,le=%q} %d\n", series, le.le, le.n)
	}
	fmt.Fprintf(&b, "dedup_store_duration_seconds_sum{%s} %s\n", series, sum)
	fmt.Fprintf(&b, "dedup_store_duration_seconds_count{%s} %d\n", series, count)
	return b.String()
}

func TestObserveCountsOutcomesByScope(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{})
	m.Observe("loyalty", dedup.OutcomeClaimed)
	m.Observe("loyalty", dedup.OutcomeClaimed)
	m.Observe("loyalty", dedup.OutcomeDuplicate)
	m.Observe("loyalty", dedup.OutcomeTTLMiss)
	m.Observe("billing", dedup.OutcomeStoreError)

	want := "# HELP dedup_outcomes_total x\n# TYPE dedup_outcomes_total counter\n" +
		outcomeLines("dedup_outcomes_total", "billing", map[string]int{"store_error": 1}) +
		outcomeLines("dedup_outcomes_total", "loyalty", map[string]int{"claimed": 2, "duplicate": 1, "ttl_miss": 1})
	// The HELP text is compared too; take it from the registry.
	want = strings.Replace(want, "# HELP dedup_outcomes_total x", helpLine(t, reg, "dedup_outcomes_total"), 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dedup_outcomes_total"); err != nil {
		t.Fatal(err)
	}
}

func helpLine(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return "# HELP " + name + " " + mf.GetHelp()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return ""
}

func TestSeriesPrecreatedAtZero(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{Scopes: []string{"loyalty"}})
	n, err := testutil.GatherAndCount(reg, "dedup_outcomes_total")
	if err != nil {
		t.Fatal(err)
	}
	if want := len(dedup.Outcomes()); n != want {
		t.Fatalf("series after New with Scopes: got %d, want %d (one per outcome)", n, want)
	}
	// A scope seen for the first time gets all its series too.
	m.Observe("billing", dedup.OutcomeClaimed)
	if n, _ = testutil.GatherAndCount(reg, "dedup_outcomes_total"); n != 2*len(dedup.Outcomes()) {
		t.Fatalf("series after a second scope: got %d, want %d", n, 2*len(dedup.Outcomes()))
	}
}

func TestObserveStoreResults(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{Buckets: []float64{0.001, 0.01}})
	m.ObserveStore("loyalty", dedup.OpClaim, 500*time.Microsecond, nil)
	m.ObserveStore("loyalty", dedup.OpClaim, 5*time.Millisecond, fmt.Errorf("dial: %w", errors.New("connection refused")))
	m.ObserveStore("loyalty", dedup.OpComplete, 20*time.Millisecond, fmt.Errorf("redisstore: %w", stores.ErrLostClaim))
	m.ObserveStore("loyalty", dedup.OpClaim, 0, fmt.Errorf("x: %w", stores.ErrInvalidKey))

	want := helpLine(t, reg, "dedup_store_duration_seconds") + `
# TYPE dedup_store_duration_seconds histogram
` + storeLines("claim", "error", 0, 1, 1, "0.005") +
		storeLines("claim", "invalid", 1, 1, 1, "0") +
		storeLines("claim", "ok", 1, 1, 1, "0.0005") +
		storeLines("complete", "lost_claim", 0, 0, 1, "0.02")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dedup_store_duration_seconds"); err != nil {
		t.Fatal(err)
	}
}

func TestResult(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, dedup.ResultOK},
		{errors.New("boom"), dedup.ResultError},
		{context.DeadlineExceeded, dedup.ResultError},
		{fmt.Errorf("wrapped: %w", stores.ErrClosed), dedup.ResultError},
		{fmt.Errorf("wrapped: %w", stores.ErrLostClaim), dedup.ResultLostClaim},
		{fmt.Errorf("wrapped: %w", stores.ErrInvalidArgument), dedup.ResultInvalid},
		{fmt.Errorf("wrapped: %w", stores.ErrInvalidKey), dedup.ResultInvalid},
	} {
		if got := dedup.StoreResult(tc.err); got != tc.want {
			t.Errorf("Result(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestNamespaceSubsystemConstLabels(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{
		Namespace:   "payments",
		Subsystem:   "inbox",
		ConstLabels: prometheus.Labels{"service": "loyalty"},
	})
	m.Observe("h", dedup.OutcomeDuplicate)
	m.ObserveStore("h", dedup.OpClaim, time.Millisecond, nil)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		for _, metric := range mf.GetMetric() {
			found := false
			for _, lp := range metric.GetLabel() {
				if lp.GetName() == "service" && lp.GetValue() == "loyalty" {
					found = true
				}
			}
			if !found {
				t.Errorf("%s series %v lacks the const label service=loyalty", mf.GetName(), metric.GetLabel())
			}
		}
	}
	for _, want := range []string{"payments_inbox_outcomes_total", "payments_inbox_store_duration_seconds"} {
		if !names[want] {
			t.Errorf("metric %s not registered; got %v", want, names)
		}
	}
}

func TestNewErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := prommetrics.New(prommetrics.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	_, err := prommetrics.New(prommetrics.Config{Registerer: reg})
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("second New on one registry: got %v, want an AlreadyRegisteredError", err)
	}
	// A failed New leaves nothing half-registered: another namespace works.
	if _, err := prommetrics.New(prommetrics.Config{Registerer: reg, Namespace: "other"}); err != nil {
		t.Fatalf("New with another namespace: %v", err)
	}

	if _, err := prommetrics.New(prommetrics.Config{Registerer: prometheus.NewRegistry(), Buckets: []float64{1, 0.5}}); err == nil || !strings.Contains(err.Error(), "Buckets") {
		t.Fatalf("decreasing buckets: got %v, want an error naming Buckets", err)
	}
	for _, cfg := range []prommetrics.Config{{Namespace: "bad-name"}, {Subsystem: "1st"}} {
		cfg.Registerer = prometheus.NewRegistry()
		if _, err := prommetrics.New(cfg); err == nil {
			t.Errorf("invalid name accepted: namespace %q, subsystem %q", cfg.Namespace, cfg.Subsystem)
		}
	}
}

func TestHalfRegisteredIsRolledBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Occupy the histogram's name so the second registration fails.
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dedup", Name: "store_duration_seconds", Help: "taken"}))
	if _, err := prommetrics.New(prommetrics.Config{Registerer: reg}); err == nil {
		t.Fatal("New succeeded although store_duration_seconds was taken")
	}
	// The outcomes counter registered first must have been unregistered.
	if n, err := testutil.GatherAndCount(reg, "dedup_outcomes_total"); err != nil || n != 0 {
		t.Fatalf("outcomes_total left registered after a failed New: %d series, %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "dedup_outcomes_total" {
			t.Fatal("dedup_outcomes_total is still gathered after a failed New")
		}
	}
}

func TestInvalidUTF8DoesNotPanic(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{})
	m.Observe("bad\xffscope", dedup.OutcomeClaimed)
	m.ObserveStore("bad\xffscope", "op\xfe", time.Millisecond, nil)
	if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
		t.Fatalf("gather after invalid UTF-8 labels: %d series, %v", n, err)
	}
}

func TestLint(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{})
	m.Observe("loyalty", dedup.OutcomeClaimed)
	m.ObserveStore("loyalty", dedup.OpClaim, time.Millisecond, nil)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestConcurrentUse(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{})
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			scope := fmt.Sprintf("h%d", g%3)
			for range each {
				m.Observe(scope, dedup.OutcomeClaimed)
				m.ObserveStore(scope, dedup.OpClaim, time.Microsecond, nil)
			}
		})
	}
	wg.Wait()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var claimed float64
	for _, mf := range mfs {
		if mf.GetName() != "dedup_outcomes_total" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == "claimed" {
					claimed += metric.GetCounter().GetValue()
				}
			}
		}
	}
	if claimed != goroutines*each {
		t.Fatalf("claimed total = %v, want %d", claimed, goroutines*each)
	}
}

// The adapter wired into the real middleware: a message, its redelivery and
// a failed attempt produce the expected series.
func TestWithMiddleware(t *testing.T) {
	m, reg := newMetrics(t, prommetrics.Config{})
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	dedupMW, err := middleware.New(middleware.Config{Store: store, Scope: "loyalty", Policy: dedup.Policy{Metrics: m}})
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	h := dedupMW.Middleware(func(*message.Message) ([]*message.Message, error) {
		if fail {
			fail = false
			return nil, errors.New("transient")
		}
		return nil, nil
	})
	msg := message.NewMessage("evt-1", []byte(`{}`))
	for range 3 { // fails, succeeds, duplicate
		_, _ = h(msg)
	}

	want := helpLine(t, reg, "dedup_outcomes_total") + "\n# TYPE dedup_outcomes_total counter\n" +
		outcomeLines("dedup_outcomes_total", "loyalty", map[string]int{"claimed": 2, "released": 1, "duplicate": 1})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dedup_outcomes_total"); err != nil {
		t.Fatal(err)
	}
	// Store calls: three claims, one release, one complete, all ok.
	counts := map[string]uint64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "dedup_store_duration_seconds" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			var op, result string
			for _, lp := range metric.GetLabel() {
				switch lp.GetName() {
				case "op":
					op = lp.GetValue()
				case "result":
					result = lp.GetValue()
				}
			}
			counts[op+"/"+result] += metric.GetHistogram().GetSampleCount()
		}
	}
	wantCounts := map[string]uint64{"claim/ok": 3, "release/ok": 1, "complete/ok": 1}
	for k, v := range wantCounts {
		if counts[k] != v {
			t.Errorf("store calls %s: got %d, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
}

// Buckets must be strictly increasing: a repeated bound is refused with
// an error, as a decreasing one is.
func TestRepeatedBucketRefused(t *testing.T) {
	if _, err := prommetrics.New(prommetrics.Config{Registerer: prometheus.NewRegistry(), Buckets: []float64{0.5, 1, 1, 2}}); err == nil || !strings.Contains(err.Error(), "Buckets") {
		t.Fatalf("repeated bucket: got %v, want an error naming Buckets", err)
	}
}
