package main

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/prommetrics"
	"github.com/watermill-dedup/dedup/stores"
)

// The shape of a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// exportedSeries gathers the series names the adapter exports, after one
// observation of each kind so that every family exists.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := prommetrics.New(prommetrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("s", dedup.OutcomeClaimed)
	m.ObserveStore("s", dedup.OpClaim, time.Millisecond, nil)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[n+suffix] = true
			}
		}
	}
	return names
}

// exportedLabelValues are the values prommetrics gives its labels outcome,
// result and op.
func exportedLabelValues() map[string][]string {
	outcomes := []string{}
	for _, o := range dedup.Outcomes() {
		outcomes = append(outcomes, o.String())
	}
	return map[string][]string{
		"outcome": outcomes,
		"result":  {dedup.ResultOK, dedup.ResultError, dedup.ResultLostClaim, dedup.ResultInvalid},
		"op":      {dedup.OpClaim, dedup.OpComplete, dedup.OpRelease, dedup.OpExtend, dedup.OpBegin, dedup.OpCommit, dedup.OpRollback},
	}
}

var (
	metricRef   = regexp.MustCompile(`\b(dedup[_:][a-zA-Z0-9_:]*)`)
	labelMatch  = regexp.MustCompile(`\b(outcome|result|op)\s*(=~|!~|=|!=)\s*"([^"]*)"`)
	rangeSuffix = regexp.MustCompile(`\[[0-9]+[smhdw]\]`)
)

// TestAlertRules parses alerts.yml as a rule file and checks that every
// expression refers to metrics the adapter exports (or that the file
// records), with label values the adapter produces, and that the
// thresholds are there.
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("alerts.yml is not a valid rule file: %v", err)
	}

	exported := exportedSeries(t)
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	labelValues := exportedLabelValues()

	alerts := map[string]string{} // name -> expr
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("rule %q: exactly one of alert and record must be set", name)
			}
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %q: empty expr", name)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("rule %q: unbalanced brackets in %q", name, r.Expr)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rule %q: for %q: %v", name, r.For, err)
				}
			}
			if r.Alert != "" {
				alerts[r.Alert] = r.Expr
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("alert %q: needs labels.severity and annotations.summary", name)
				}
			}
			refs := metricRef.FindAllString(r.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("rule %q: refers to no dedup metric: %q", name, r.Expr)
			}
			for _, m := range refs {
				if !exported[m] && !recorded[m] {
					t.Errorf("rule %q: %s is neither exported by prommetrics nor recorded in alerts.yml", name, m)
				}
			}
			for _, lm := range labelMatch.FindAllStringSubmatch(r.Expr, -1) {
				label, op, value := lm[1], lm[2], lm[3]
				for _, v := range strings.Split(value, "|") {
					if (op == "=" || op == "=~") && !slices.Contains(labelValues[label], v) {
						t.Errorf("rule %q: %s=%q is not a value prommetrics exports (%v)", name, label, v, labelValues[label])
					}
				}
			}
			if !rangeSuffix.MatchString(r.Expr) && r.Record != "" {
				t.Errorf("recording rule %q has no range: %q", name, r.Expr)
			}
		}
	}

	// The thresholds: a hit rate 5x its baseline for 5 minutes, store
	// errors over 1%, any ttl miss.
	for alert, want := range map[string][]string{
		"DedupHitRateSpike": {"5 *", "dedup:hit_ratio:rate5m"},
		"DedupStoreErrors":  {"> 0.01", "dedup:store_error_ratio:rate1m"},
		"DedupTTLMiss":      {`outcome="ttl_miss"`, "> 0"},
	} {
		expr, ok := alerts[alert]
		if !ok {
			t.Errorf("alerts.yml lacks alert %s", alert)
			continue
		}
		for _, w := range want {
			if !strings.Contains(expr, w) {
				t.Errorf("alert %s: expr %q lacks %q", alert, expr, w)
			}
		}
	}
	var forSpike string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "DedupHitRateSpike" {
				forSpike = r.For
			}
		}
	}
	if forSpike != "5m" {
		t.Errorf("DedupHitRateSpike: for %q, want 5m (5x baseline for 5 minutes)", forSpike)
	}
}

// The result label the error-rate rule counts is a backend failure only.
func TestStoreErrorResultLabel(t *testing.T) {
	if got := dedup.StoreResult(errors.New("connection refused")); got != "error" {
		t.Fatalf("Result(backend failure) = %q, want error", got)
	}
	if got := dedup.StoreResult(stores.ErrLostClaim); got == "error" {
		t.Fatal("a lost claim counts as a store error; the error-rate alert would fire on fencing")
	}
}
