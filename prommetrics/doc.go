// Package prommetrics exports what the dedup middleware and the publisher
// decorator do to Prometheus: it implements [dedup.Metrics] with two
// collectors.
//
//	<namespace>_outcomes_total{scope, outcome}                 counter
//	<namespace>_store_duration_seconds{scope, op, result}      histogram
//
// outcome is one of the [dedup.Outcome] names (claimed, duplicate,
// in_progress, takeover, store_error, bypassed, lost_claim, ttl_miss, no_key,
// fingerprint_mismatch, released, cancelled); op is a store operation (claim, complete,
// release, extend, begin, commit, rollback); result is one of
// dedup.StoreResult's: ok, error (a backend failure: the numerator of a
// store error rate), lost_claim (a fenced call refused because the lease
// was taken over) or invalid (a key or argument the store rejected
// before any I/O).
//
// The first time a scope is seen, every outcome series of that scope is
// created at zero, so that increase() and rate() see the first ttl_miss or
// bypass instead of a series appearing out of nowhere. Create one Metrics per
// registry and share it between middlewares and publishers: scope tells
// them apart (a publisher's default scope is "publish:" and the topic).
//
//	reg := prometheus.NewRegistry()
//	metrics, err := prommetrics.New(prommetrics.Config{Registerer: reg})
//	if err != nil { ... }
//	dedupMW, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Metrics: metrics}})
//	...
//	dp, err := publisher.New(publisher.Config{Store: store, Policy: dedup.Policy{Metrics: metrics}})
package prommetrics
