package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/otelmetrics"
	"github.com/watermill-dedup/dedup/prommetrics"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// flaky fails every third Claim with an outage.
type flaky struct {
	stores.Store
	n int
}

func (f *flaky) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	f.n++
	if f.n%3 == 0 {
		return nil, fmt.Errorf("%w: reset", stores.ErrUnavailable)
	}
	return f.Store.Claim(ctx, scope, keys, lease)
}

// TestSameAsPrometheus: on the same run, the OpenTelemetry metrics count
// what the Prometheus ones count: every outcome per scope, every store
// call per operation and result, bucket by bucket.
func TestSameAsPrometheus(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	om, err := otelmetrics.New(otelmetrics.Config{MeterProvider: provider})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pm, err := prommetrics.New(prommetrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close(context.Background()) })
	for _, scope := range []string{"loyalty", "audit"} {
		mw, err := middleware.New(middleware.Config{Store: &flaky{Store: mem}, Scope: scope, Policy: dedup.Policy{Metrics: dedup.TeeMetrics(pm, om), Logger: watermill.NopLogger{}}})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if msg.UUID == "m-4" {
				return nil, errors.New("boom")
			}
			return nil, nil
		})
		for i := range 30 {
			_, _ = h(message.NewMessage(fmt.Sprintf("m-%d", i%7), nil))
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	otelOutcomes := map[string]int64{}
	otelCalls := map[string][]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelmetrics.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != otelmetrics.OutcomesName || m.Unit != otelmetrics.OutcomesUnit || !data.IsMonotonic {
					t.Fatalf("counter %s (%s, monotonic %v)", m.Name, m.Unit, data.IsMonotonic)
				}
				for _, dp := range data.DataPoints {
					scope, _ := dp.Attributes.Value(otelmetrics.AttrScope)
					o, _ := dp.Attributes.Value(otelmetrics.AttrOutcome)
					otelOutcomes[scope.AsString()+"/"+o.AsString()] = dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != otelmetrics.StoreDurationName || m.Unit != "s" {
					t.Fatalf("histogram %s (%s)", m.Name, m.Unit)
				}
				for _, dp := range data.DataPoints {
					scope, _ := dp.Attributes.Value(otelmetrics.AttrScope)
					op, _ := dp.Attributes.Value(otelmetrics.AttrOperation)
					res, _ := dp.Attributes.Value(otelmetrics.AttrResult)
					otelCalls[scope.AsString()+"/"+op.AsString()+"/"+res.AsString()] = append([]uint64{dp.Count}, dp.BucketCounts...)
				}
			}
		}
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	promOutcomes := map[string]int64{}
	promCalls := map[string][]uint64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			l := labels(m)
			switch f.GetName() {
			case "dedup_outcomes_total":
				if v := int64(m.GetCounter().GetValue()); v > 0 {
					promOutcomes[l["scope"]+"/"+l["outcome"]] = v
				}
			case "dedup_store_duration_seconds":
				h := m.GetHistogram()
				counts := []uint64{h.GetSampleCount()}
				prev := uint64(0)
				for _, b := range h.GetBucket() {
					counts = append(counts, b.GetCumulativeCount()-prev)
					prev = b.GetCumulativeCount()
				}
				counts = append(counts, h.GetSampleCount()-prev) // +Inf
				promCalls[l["scope"]+"/"+l["op"]+"/"+l["result"]] = counts
			}
		}
	}
	if len(promOutcomes) < 8 || fmt.Sprint(promOutcomes) != fmt.Sprint(otelOutcomes) {
		t.Fatalf("outcomes differ:\nprometheus    %v\nopentelemetry %v", promOutcomes, otelOutcomes)
	}
	if len(promCalls) < 4 || fmt.Sprint(promCalls) != fmt.Sprint(otelCalls) {
		t.Fatalf("store calls differ:\nprometheus    %v\nopentelemetry %v", promCalls, otelCalls)
	}
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestConfig(t *testing.T) {
	if _, err := otelmetrics.New(otelmetrics.Config{Buckets: []float64{1, 1}}); err == nil {
		t.Fatal("New accepted buckets that do not increase")
	}
	m, err := otelmetrics.New(otelmetrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("\xff", dedup.OutcomeClaimed) // the global provider, a no-op; invalid UTF-8 made valid
	m.ObserveStore("s", dedup.OpClaim, time.Millisecond, nil)
}
