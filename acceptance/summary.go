package acceptance

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Results of a summary row.
const (
	ResultPass = "PASS"
	ResultFail = "FAIL"
	ResultSkip = "SKIP"
	// ResultNotApplicable marks a scenario that cannot apply to a pair
	// (the outage scenario on an embedded store); the note says why.
	ResultNotApplicable = "n/a"
)

// Row is one line of the summary: a scenario run on a backend and a store.
type Row struct {
	Broker, Store, Scenario string
	// Events is the number of logical events published.
	Events int
	// Deliveries is the number of deliveries the consumers received,
	// redeliveries and duplicates included.
	Deliveries int
	// Duplicates is the number of deliveries the middleware dropped as
	// duplicates (dedup.OutcomeDuplicate).
	Duplicates int
	// Effects is the number of effects in the ledger.
	Effects  int
	Result   string
	Note     string
	Duration time.Duration
}

var summary struct {
	mu   sync.Mutex
	rows []Row
}

func recordRow(r Row) {
	summary.mu.Lock()
	summary.rows = append(summary.rows, r)
	summary.mu.Unlock()
}

func recordNotApplicable(b Backend, s Store, sc Scenario, reason string) {
	recordRow(Row{Broker: b.Name, Store: s.Name, Scenario: sc.label(""), Result: ResultNotApplicable, Note: reason})
}

// Rows returns the rows recorded so far, sorted by broker, store and
// scenario.
func Rows() []Row {
	summary.mu.Lock()
	rows := append([]Row(nil), summary.rows...)
	summary.mu.Unlock()
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Broker != b.Broker {
			return a.Broker < b.Broker
		}
		if a.Store != b.Store {
			return a.Store < b.Store
		}
		return a.Scenario < b.Scenario
	})
	return rows
}

// WriteSummary writes the table of every scenario run by this process:
// broker x store x scenario -> events, deliveries, duplicates dropped,
// effects, result. It writes nothing in a child consumer process or when
// nothing ran. Call it from TestMain after m.Run.
func WriteSummary(w io.Writer) {
	if childSpecFromEnv() != nil {
		return
	}
	rows := Rows()
	if len(rows) == 0 {
		return
	}
	counts := map[string]int{}
	for _, r := range rows {
		counts[r.Result]++
	}
	fmt.Fprintf(w, "\nacceptance summary: %d runs: %d %s, %d %s, %d %s, %d %s\n", len(rows),
		counts[ResultPass], ResultPass, counts[ResultFail], ResultFail, counts[ResultSkip], ResultSkip, counts[ResultNotApplicable], ResultNotApplicable)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BROKER\tSTORE\tSCENARIO\tEVENTS\tDELIVERIES\tDUPS DROPPED\tEFFECTS\tRESULT\tTIME\tNOTES")
	for _, r := range rows {
		if r.Result == ResultNotApplicable {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t%s\t-\t%s\n", r.Broker, r.Store, r.Scenario, r.Result, r.Note)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Broker, r.Store, r.Scenario,
			r.Events, r.Deliveries, r.Duplicates, r.Effects, r.Result, r.Duration.Round(100*time.Millisecond), strings.TrimSpace(r.Note))
	}
	_ = tw.Flush()
}
