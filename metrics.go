package dedup

import (
	"errors"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// Outcome is one thing the middleware or the publisher did with a
// message, reported to [Metrics].
type Outcome uint8

// Outcomes. One message can produce several (claimed and takeover, say).
const (
	// OutcomeClaimed: the keys were claimed and the effect ran (the
	// handler, or the publish).
	OutcomeClaimed Outcome = iota + 1
	// OutcomeDuplicate: the message was already done; acked without running
	// the handler (stored outputs, if any, were re-emitted), or not
	// published.
	OutcomeDuplicate
	// OutcomeInProgress: another consumer holds the keys; nacked.
	OutcomeInProgress
	// OutcomeTakeover: the claim took over an expired lease — the previous
	// holder probably crashed, possibly after its side effect.
	OutcomeTakeover
	// OutcomeStoreError: a store call failed.
	OutcomeStoreError
	// OutcomeBypassed: under FailOpen the effect ran without protection.
	OutcomeBypassed
	// OutcomeLostClaim: the claim was lost while the effect ran (lease
	// expired and someone took over); its Complete was refused.
	OutcomeLostClaim
	// OutcomeTTLMiss: a claimed message was older than the retention
	// window, so an earlier run's record may have expired already. It is
	// counted per claim: a stale message whose handler fails and is retried
	// counts once per attempt.
	OutcomeTTLMiss
	// OutcomeNoKey: the key function could not key the message.
	OutcomeNoKey
	// OutcomeFingerprintMismatch: a duplicate key with a different payload.
	OutcomeFingerprintMismatch
	// OutcomeReleased: the effect failed or panicked (the handler, or the
	// publish) and the claim was released for a retry.
	OutcomeReleased
	// OutcomeCancelled: the message's context ended (the subscriber shut
	// down, an outer Timeout middleware fired) before the store answered
	// the claim; the message was nacked without running the effect.
	OutcomeCancelled
	// OutcomeCorruptRecord: a duplicate's stored record data could not be
	// decoded (ErrCorruptRecord).
	OutcomeCorruptRecord
)

var outcomeNames = [...]string{
	OutcomeClaimed:             "claimed",
	OutcomeDuplicate:           "duplicate",
	OutcomeInProgress:          "in_progress",
	OutcomeTakeover:            "takeover",
	OutcomeStoreError:          "store_error",
	OutcomeBypassed:            "bypassed",
	OutcomeLostClaim:           "lost_claim",
	OutcomeTTLMiss:             "ttl_miss",
	OutcomeNoKey:               "no_key",
	OutcomeFingerprintMismatch: "fingerprint_mismatch",
	OutcomeReleased:            "released",
	OutcomeCancelled:           "cancelled",
	OutcomeCorruptRecord:       "corrupt_record",
}

// String returns the outcome's snake_case name, used as a metric label.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "unknown"
}

// Outcomes lists every outcome, for adapters that pre-create series.
func Outcomes() []Outcome {
	var out []Outcome
	for o := OutcomeClaimed; int(o) < len(outcomeNames); o++ {
		out = append(out, o)
	}
	return out
}

// Store operations reported to Metrics.ObserveStore.
const (
	OpClaim    = "claim"
	OpComplete = "complete"
	OpRelease  = "release"
	OpExtend   = "extend"
	OpBegin    = "begin"
	OpCommit   = "commit"
	OpRollback = "rollback"
)

// Metrics receives what the middleware and the publisher do, by scope.
// Implementations must be safe for concurrent use and fast: they are
// called on every message. The prommetrics package implements it.
type Metrics interface {
	// Observe is called with each outcome for a message in scope.
	Observe(scope string, o Outcome)
	// ObserveStore is called after each store call with its duration and
	// error (nil on success).
	ObserveStore(scope, op string, d time.Duration, err error)
}

// NopMetrics discards everything.
type NopMetrics struct{}

// Observe does nothing.
func (NopMetrics) Observe(string, Outcome) {}

// ObserveStore does nothing.
func (NopMetrics) ObserveStore(string, string, time.Duration, error) {}

// Results of a store call, as the metrics exporters label its latency
// (StoreResult).
const (
	ResultOK        = "ok"         // the call succeeded
	ResultError     = "error"      // a backend failure: the numerator of a store error rate
	ResultLostClaim = "lost_claim" // a fenced call refused: the lease was taken over
	ResultInvalid   = "invalid"    // a key, argument or data the store refused before any I/O
)

// StoreResult classifies the error of a store call for a latency metric:
// ResultOK, ResultLostClaim, ResultInvalid or ResultError.
func StoreResult(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, stores.ErrLostClaim):
		return ResultLostClaim
	case errors.Is(err, stores.ErrInvalidKey), errors.Is(err, stores.ErrInvalidArgument):
		return ResultInvalid
	default:
		return ResultError
	}
}

// TeeMetrics returns a Metrics that passes everything to each of ms: to
// export to Prometheus and OpenTelemetry at once, say.
func TeeMetrics(ms ...Metrics) Metrics { return tee(ms) }

type tee []Metrics

func (t tee) Observe(scope string, o Outcome) {
	for _, m := range t {
		m.Observe(scope, o)
	}
}

func (t tee) ObserveStore(scope, op string, d time.Duration, err error) {
	for _, m := range t {
		m.ObserveStore(scope, op, d, err)
	}
}

// StoreLatencyBuckets returns the upper bounds, in seconds, of the store
// latency histogram both exporters (prommetrics, otelmetrics) use by
// default: from 100µs (an in-memory store) to 5s (DefaultStoreTimeout),
// so that both give the same counts for one run. Each call returns a new
// slice.
func StoreLatencyBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
}
