// Package otelmetrics exports what the dedup middleware and the publisher
// decorator do to OpenTelemetry metrics: it implements [dedup.Metrics] on
// the OTel metric API, the sibling of the prommetrics package.
//
//	dedup.outcomes                     counter, unit {outcome}
//	    dedup.scope, dedup.outcome
//	dedup.store.operation.duration     histogram, unit s
//	    dedup.scope, dedup.operation, dedup.result
//
// dedup.outcome is one of the [dedup.Outcome] names (claimed, duplicate,
// in_progress, takeover, store_error, bypassed, lost_claim, ttl_miss,
// no_key, fingerprint_mismatch, released, cancelled, corrupt_record);
// dedup.operation a store operation (claim, complete, release, extend,
// begin, commit, rollback); dedup.result one of [dedup.StoreResult]'s (ok,
// error, lost_claim, invalid). The histogram's buckets are
// dedup.StoreLatencyBuckets (100µs to 5s), prommetrics' too, so both
// exporters of one run give the same counts.
//
//	metrics, err := otelmetrics.New(otelmetrics.Config{MeterProvider: provider})
//	if err != nil { ... }
//	dedupMW, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Metrics: metrics}})
//
// To export to Prometheus and OpenTelemetry at once, pass
// dedup.TeeMetrics(promMetrics, otelMetrics).
package otelmetrics
