package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// result is what a run did, for the summary.
type result struct {
	cfg       Config
	runID     string
	mode      dedup.Mode
	topic     string
	broker    string // description
	brokerDup string // what the broker's own dedup caught, if it has one
	producer  string // description
	keys      string // what the middleware keys by
	store     string // description
	retention retentionCheck

	plan            plan
	published       int
	publishFailures int
	stats           deliveryStats
	handlerRuns     int64 // times the handler was called
	retries         int64 // attempts the router's retry middleware made after a delivery's first
	failures        int   // injected
	crashes         int
	lostAcks        int
	outcome         func(dedup.Outcome) int64
	ledger          ledgerSnapshot
	ledgerErr       error
	elapsed         time.Duration
	finished        bool  // every published message was acked
	runErr          error // the run could not go on (publish failed, interrupted)

	processes *processesResult // the kill demo's processes and kills; nil: one process
}

// verdict checks the invariant: every payment awarded once, none lost.
// Lease mode may award a payment twice when its consumer crashed between
// the side effect and recording it done (at most once per crash); the
// summary says so instead of hiding it.
type verdict struct {
	ok   bool
	line string
}

func (r *result) missingAndExtra() (missing int, extra int64) {
	for id := range r.plan.expected {
		switch n := r.ledger.PerPayment[id]; {
		case n == 0:
			missing++
		case n > 1:
			extra += n - 1
		}
	}
	return missing, extra
}

func (r *result) verdict() verdict {
	expected := r.plan.expectedTotal()
	switch {
	case r.runErr != nil:
		return verdict{false, fmt.Sprintf("invariant: NOT CHECKED — the run stopped early: %v", r.runErr)}
	case r.ledgerErr != nil:
		return verdict{false, fmt.Sprintf("invariant: NOT CHECKED — cannot read the ledger: %v", r.ledgerErr)}
	case !r.finished:
		return verdict{false, fmt.Sprintf("invariant: INCOMPLETE — %d of %d published messages were not acked within -timeout %s", r.stats.unacked, r.published, r.cfg.Timeout)}
	}
	missing, extra := r.missingAndExtra()
	total := r.ledger.BalanceTotal
	switch {
	case missing > 0 && r.stats.poisoned > 0:
		// Acked by the poison queue, never handled: not lost.
		return verdict{false, fmt.Sprintf("invariant: BROKEN — %d messages went to the poison topic (%d payments never awarded): ledger %d != expected %d", r.stats.poisoned, missing, total, expected)}
	case missing > 0:
		return verdict{false, fmt.Sprintf("invariant: BROKEN — %d payments were never awarded although their messages were acked (lost messages): ledger %d != expected %d", missing, total, expected)}
	case r.ledger.BalanceTotal != r.ledger.EntryPoints:
		return verdict{false, fmt.Sprintf("invariant: BROKEN — the balances (%d) disagree with the ledger entries (%d)", r.ledger.BalanceTotal, r.ledger.EntryPoints)}
	case r.stats.poisoned > 0:
		return verdict{false, fmt.Sprintf("invariant: BROKEN — %d messages went to the poison topic", r.stats.poisoned)}
	case extra > 0 && r.cfg.Dedup && r.mode != dedup.ModeTransactional && extra <= int64(r.crashes):
		return verdict{true, fmt.Sprintf("invariant: OK (lease mode) — no payment lost; %d awarded twice after %d injected crashes between side effect and Complete, the bounded duplicate lease mode allows (ledger %d = expected %d + %d)", extra, r.crashes, total, expected, total-expected)}
	case extra > 0 && r.cfg.Dedup && r.bypassed() > 0 && extra <= r.bypassed()+r.leaseCrashes():
		// Fail-open's documented bound: a handler run that bypassed the
		// store left no record, so another delivery of its message may
		// run again: at most one extra award a bypassed run.
		return verdict{true, fmt.Sprintf("invariant: OK (fail-open) — no payment lost; %d extra awards, within fail-open's bound of one a handler run that bypassed the store (%d bypassed%s) (ledger %d = expected %d + %d)",
			extra, r.bypassed(), r.crashNote(), total, expected, total-expected)}
	case extra > 0:
		hint := ""
		if lost := r.outcome(dedup.OutcomeLostClaim); lost > 0 && r.mode != dedup.ModeTransactional {
			hint = fmt.Sprintf("; %d claims were lost because their lease (-lease %s) expired under a running handler: raise -lease", lost, r.cfg.Lease)
		}
		return verdict{false, fmt.Sprintf("invariant: BROKEN — %d duplicate awards: ledger %d != expected %d%s", extra, total, expected, hint)}
	case total != expected:
		return verdict{false, fmt.Sprintf("invariant: BROKEN — ledger %d != expected %d", total, expected)}
	default:
		return verdict{true, fmt.Sprintf("invariant: OK — every payment awarded exactly once (ledger %d == expected %d)", total, expected)}
	}
}

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "\nrouter_example: payments -> loyalty, run %s\n", r.runID)
	fmt.Fprintf(w, "  broker     %s (%s), topic %s\n", r.cfg.Broker, r.broker, r.topic)
	if r.brokerDup != "" {
		fmt.Fprintf(w, "  broker dedup %s\n", r.brokerDup)
	}
	if r.producer != "" {
		fmt.Fprintf(w, "  producer   %s\n", r.producer)
	}
	if r.keys != "" && r.cfg.Dedup {
		fmt.Fprintf(w, "  keys       %s\n", r.keys)
	}
	fmt.Fprintf(w, "  store      %s (%s), mode %s\n", r.cfg.Store, r.store, modeText(r.cfg))
	fmt.Fprintf(w, "  retention  %s\n\n", r.retention)

	row := func(label string, n int64, note string) {
		line := fmt.Sprintf("  %-28s %9d  %s", label, n, note)
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	o := r.outcome
	row("events (distinct payments)", int64(r.plan.events), fmt.Sprintf("%d customers", r.cfg.Customers))
	row("published messages", int64(r.published), r.publishedNote())
	row("deliveries", int64(r.stats.deliveries), "")
	row("redelivered", int64(r.stats.redelivered), r.redeliveredNote())
	row("retried in process", r.retries, fmt.Sprintf("%d injected failures; with backoff, at most %d times a delivery (-retries)", r.failures, r.cfg.Retries))
	if r.cfg.Dedup {
		row("claimed (handler ran)", o(dedup.OutcomeClaimed), "")
		row("duplicates dropped", o(dedup.OutcomeDuplicate), "acked without running the handler")
		row("in progress (nacked)", o(dedup.OutcomeInProgress), "")
		row("lease takeovers", o(dedup.OutcomeTakeover), "")
		row("ttl misses", o(dedup.OutcomeTTLMiss), fmt.Sprintf("%d stale events published", r.plan.stale))
		row("store errors", o(dedup.OutcomeStoreError), "")
		row("bypassed (fail-open)", o(dedup.OutcomeBypassed), "")
	} else {
		// Nothing claims, drops or counts outcomes without the middleware.
		row("handler ran", r.handlerRuns, "no middleware (-dedup=false): duplicates run it too")
	}
	row("poisoned", int64(r.stats.poisoned), "")
	row("effects applied", r.ledger.Entries, "ledger entries")
	row("ledger total", r.ledger.BalanceTotal, "points")
	row("expected", r.plan.expectedTotal(), "points")
	rate := ""
	if s := r.elapsed.Seconds(); s > 0 {
		rate = fmt.Sprintf("%.0f deliveries/s", float64(r.stats.deliveries)/s)
	}
	fmt.Fprintf(w, "  %-28s %9s  %s\n", "elapsed", r.elapsed.Round(time.Millisecond), rate)
	if r.processes != nil {
		r.processes.print(w, r)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, r.verdict().line)
}

// bypassed is the number of handler runs fail-open let through unprotected.
func (r *result) bypassed() int64 { return r.outcome(dedup.OutcomeBypassed) }

// leaseCrashes is the number of injected crashes that lease mode may turn
// into a second award (none in transactional mode: nothing committed).
func (r *result) leaseCrashes() int64 {
	if r.mode == dedup.ModeTransactional {
		return 0
	}
	return int64(r.crashes)
}

func (r *result) crashNote() string {
	if r.leaseCrashes() == 0 {
		return ""
	}
	return fmt.Sprintf(", plus %d injected crashes in lease mode", r.crashes)
}

// redeliveredNote says why messages came again: the injected lost acks
// and crashes, and the other nacks by cause. Nacks and redeliveries do
// not pair one to one (a nack at shutdown is never redelivered; a killed
// consumer or a rebalance redelivers without a nack), so the note ends
// with the difference, and its parts always add up to the row's count.
func (r *result) redeliveredNote() string {
	n := r.stats.nacks
	parts := []string{fmt.Sprintf("%d lost acks", r.lostAcks), fmt.Sprintf("%d crashes", r.crashes)}
	listed := r.lostAcks + r.crashes
	for _, c := range []struct {
		n    int
		what string
	}{
		{n.failures, "injected failures not fixed by a retry"},
		{n.storeErrors, "store errors"},
		{n.inProgress, "in progress elsewhere"},
		{n.other, "other errors"},
	} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
			listed += c.n
		}
	}
	switch d := r.stats.redelivered - listed; {
	case d > 0:
		parts = append(parts, fmt.Sprintf("%d without a nack (a killed consumer, a rebalance, the broker's own redelivery)", d))
	case d < 0:
		parts = append(parts, fmt.Sprintf("less %d nacked but not redelivered before the run ended", -d))
	}
	return strings.Join(parts, ", ")
}

func (r *result) publishedNote() string {
	retries := fmt.Sprintf("%d producer retries under new message ids", r.plan.retries)
	if r.cfg.Producer == producerForeign && isKafkaBroker(r.cfg.Broker) {
		retries = fmt.Sprintf("%d producer retries (new records, same record key)", r.plan.retries)
	}
	if r.published == 0 {
		retries = strings.Replace(retries, " producer retries", " of them producer retries", 1)
		return fmt.Sprintf("none of the %d planned (%s)", len(r.plan.messages), retries)
	}
	parts := []string{retries}
	if r.plan.stale > 0 {
		parts = append(parts, fmt.Sprintf("%d stale", r.plan.stale))
	}
	if r.publishFailures > 0 {
		parts = append(parts, fmt.Sprintf("%d failed publishes retried", r.publishFailures))
	}
	return strings.Join(parts, ", ")
}

// modeText names the middleware's mode, for the start line and the summary.
func modeText(c Config) string {
	switch {
	case !c.Dedup:
		return "NOT USED (-dedup=false)"
	case c.mode() == dedup.ModeTransactional:
		return "transactional inbox"
	case c.mode() == dedup.ModeAsyncComplete:
		return "lease, async complete (claim -> handler -> ack, complete in the background)"
	default:
		return "lease (claim -> handler -> complete)"
	}
}

// producerNote names a producer that is not Watermill, for the start line.
func producerNote(c Config) string {
	if c.Producer == producerForeign {
		return ", producer foreign (the broker's own client)"
	}
	return ""
}
