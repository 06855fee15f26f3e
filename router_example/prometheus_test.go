package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// The files this test checks: the rules, their promtool unit tests, and
// the Grafana dashboard.
const (
	alertsFile     = "alerts.yml"
	alertTestsFile = "alerts_test.yml"
	dashboardFile  = "grafana-dashboard.json"
	prometheusFile = "prometheus.yml"
)

// requireBinary returns the path of a program of Debian's prometheus
// package, or fails the test naming it (testkit.Unavailable).
func requireBinary(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		testkit.Unavailable(t, name+" (Debian package prometheus: apt-get install --no-install-recommends prometheus)", "$PATH", err)
	}
	return path
}

// alerts.yml passes `promtool check rules`, its unit tests
// (alerts_test.yml: quiet on a healthy run; a hit-rate spike, a bypass
// storm, store errors, a ttl miss and lease takeovers each firing) pass
// `promtool test rules`, and prometheus.yml passes `promtool check config`.
func TestPromtool(t *testing.T) {
	promtool := requireBinary(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", alertsFile},
		{"test", "rules", alertTestsFile},
		{"check", "config", prometheusFile}, // and the rule files it loads
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// The shape of a Grafana dashboard (its JSON model), as far as the tests
// read it.
type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *dashDatasource `json:"datasource"`
			AllValue   string          `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *dashDatasource `json:"datasource"`
	GridPos    struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource *dashDatasource `json:"datasource"`
	} `json:"targets"`
}

// dashTarget is one query of the dashboard.
type dashTarget struct {
	panel, refID, expr string
}

func readDashboard(t *testing.T) (dashboard, []dashTarget) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	var targets []dashTarget
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			targets = append(targets, dashTarget{panel: p.Title, refID: tg.RefID, expr: tg.Expr})
		}
	}
	return d, targets
}

const datasourceVar = "${datasource}"

var (
	// dashVarRef is a Grafana variable in an expression.
	dashVarRef = regexp.MustCompile(`\$\{?(\w+)\}?`)
	// dashVars are the variables the expressions may use: the dashboard's
	// own and Grafana's built-in ones a Prometheus query takes.
	dashVars = []string{"scope", "__rate_interval", "__range"}
)

// The dashboard is a Grafana dashboard JSON model to import: a data source
// variable every panel and query uses (so that no data source uid of ours
// is baked in), a scope variable read from the adapter's series, panels
// laid out on the 24-column grid, and queries that refer only to series
// and label values prommetrics exports, each filtered by $scope.
func TestGrafanaDashboard(t *testing.T) {
	d, targets := readDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want a uid, a title and a schemaVersion of Grafana 8 or later", d.UID, d.Title, d.SchemaVersion)
	}
	exported := exportedSeries(t)
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Name {
		case "datasource":
			if v.Type != "datasource" || string(v.Query) != `"prometheus"` {
				t.Errorf("variable datasource: type %q, query %s; want a datasource variable of type prometheus", v.Type, v.Query)
			}
		case "scope":
			if v.Type != "query" || v.Datasource == nil || v.Datasource.UID != datasourceVar {
				t.Errorf("variable scope: type %q on %+v; want a query on %s", v.Type, v.Datasource, datasourceVar)
			}
			if v.Definition != "label_values(dedup_outcomes_total, scope)" || !strings.Contains(string(v.Query), v.Definition) {
				t.Errorf("variable scope: definition %q, query %s; want label_values(dedup_outcomes_total, scope)", v.Definition, v.Query)
			}
			if v.AllValue != ".*" {
				t.Errorf("variable scope: allValue %q, want .* (the queries match it with =~)", v.AllValue)
			}
		}
	}
	if !vars["datasource"] || !vars["scope"] {
		t.Fatalf("templating: want the variables datasource and scope, got %v", vars)
	}
	if len(targets) == 0 {
		t.Fatal("the dashboard has no queries")
	}

	ids := map[int]bool{}
	labelValues := exportedLabelValues()
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d is zero or not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || p.Type == "" {
			t.Errorf("panel %d: needs a title and a type", p.ID)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
		if p.Datasource == nil || *p.Datasource != (dashDatasource{"prometheus", datasourceVar}) {
			t.Errorf("panel %q: datasource %+v, want prometheus %s", p.Title, p.Datasource, datasourceVar)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refIDs := map[string]bool{}
		for _, tg := range p.Targets {
			name := fmt.Sprintf("panel %q, query %s", p.Title, tg.RefID)
			if tg.RefID == "" || refIDs[tg.RefID] {
				t.Errorf("%s: refId empty or repeated", name)
			}
			refIDs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != datasourceVar {
				t.Errorf("%s: datasource %+v, want %s", name, tg.Datasource, datasourceVar)
			}
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") || strings.Count(tg.Expr, "{") != strings.Count(tg.Expr, "}") {
				t.Errorf("%s: unbalanced brackets in %q", name, tg.Expr)
			}
			refs := metricRef.FindAllString(tg.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("%s: refers to no dedup metric: %q", name, tg.Expr)
			}
			for _, m := range refs {
				if !exported[m] {
					t.Errorf("%s: %s is not a series prommetrics exports (recording rules are not assumed loaded)", name, m)
				}
			}
			if n := strings.Count(tg.Expr, `scope=~"$scope"`); n != len(refs) {
				t.Errorf("%s: %d of its %d selectors filter by scope=~\"$scope\": %q", name, n, len(refs), tg.Expr)
			}
			for _, lm := range labelMatch.FindAllStringSubmatch(tg.Expr, -1) {
				label, op, value := lm[1], lm[2], lm[3]
				for _, v := range strings.Split(value, "|") {
					if (op == "=" || op == "=~") && !slices.Contains(labelValues[label], v) {
						t.Errorf("%s: %s=%q is not a value prommetrics exports (%v)", name, label, v, labelValues[label])
					}
				}
			}
			for _, v := range dashVarRef.FindAllStringSubmatch(tg.Expr, -1) {
				if !slices.Contains(dashVars, v[1]) {
					t.Errorf("%s: unknown variable $%s (want one of %v)", name, v[1], dashVars)
				}
			}
		}
	}
}

// expandDashboardVars replaces the variables of a dashboard query as
// Grafana would for a Prometheus scraping every second.
func expandDashboardVars(expr, scope string) string {
	return strings.NewReplacer(
		"$__rate_interval", "30s", // >= 4 scrape intervals, as Grafana's own
		"$__range", "1h",
		"$scope", scope,
	).Replace(expr)
}

// A real Prometheus (Debian's 2.42), on a loopback port of its own, scrapes
// a run of the example and evaluates alerts.yml. Every query of the
// dashboard returns series, for one scope and for All, and so does the
// scope variable's; every rule evaluates without error and the recording
// rules produce series; what Prometheus scraped is what the run counted.
func TestPrometheusScrapesExample(t *testing.T) {
	t.Parallel()
	prometheusBin := requireBinary(t, "prometheus")
	_, targets := readDashboard(t)
	bin := buildExample(t)

	// A run with duplicates, crashes (takeovers) and a stale event (a ttl
	// miss), whose metrics stay up after its summary (-linger).
	ex := startProcess(t, "router_example", bin, "-events=200", "-store=memory", "-crash-rate=0.05", "-lease=300ms",
		"-stale-events=1", "-metrics-addr=127.0.0.1:0", "-linger=10m", "-run-id="+newTestRunID())
	ex.cmd.Env = exampleEnv()
	ex.start(t)
	metricsURL := ex.await(t, ex.err, regexp.MustCompile(`serving metrics at http://(\S+)/metrics`), 2*time.Minute)[1]
	ex.await(t, ex.out, regexp.MustCompile(`(?m)^invariant: .*\n`), 5*time.Minute)
	run := exampleRun{args: ex.cmd.Args[1:], stdout: ex.out.String(), stderr: ex.err.String()}
	requireOK(t, run)
	claimed := run.count(t, "claimed (handler ran)")

	// The configuration shipped beside alerts.yml, scraping this run every
	// second.
	shipped, err := os.ReadFile(prometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	config := strings.NewReplacer(
		`"127.0.0.1:9464"`, strconv.Quote(metricsURL),
		"scrape_interval: 5s", "scrape_interval: 1s\n  scrape_timeout: 1s",
		"evaluation_interval: 5s", "evaluation_interval: 1s",
	).Replace(string(shipped))
	if strings.Count(config, "1s") != 3 || !strings.Contains(config, metricsURL) {
		t.Fatalf("%s no longer scrapes 127.0.0.1:9464 every 5s: the test cannot point it at the run\n%s", prometheusFile, shipped)
	}
	prom := startPrometheus(t, prometheusBin, config, alertsFile)

	// Scraped: the counters are those of the run, now over.
	testkit.EventuallyEvery(t, time.Minute, promPoll, "the run's counters scraped", func() error {
		v, err := prom.scalar(fmt.Sprintf(`sum(dedup_outcomes_total{job="router_example",scope=%q,outcome="claimed"})`, handlerName))
		if err != nil {
			return err
		}
		if v != float64(claimed) {
			return fmt.Errorf("Prometheus has %v claimed, the run's summary %d", v, claimed)
		}
		return nil
	})

	// The scope variable's query, label_values(dedup_outcomes_total, scope).
	testkit.EventuallyEvery(t, time.Minute, promPoll, "the scope variable's values", func() error {
		var scopes []string
		if err := prom.get("/api/v1/label/scope/values", url.Values{"match[]": {"dedup_outcomes_total"}}, &scopes); err != nil {
			return err
		}
		if !slices.Contains(scopes, handlerName) {
			return fmt.Errorf("scope values %v lack %s", scopes, handlerName)
		}
		return nil
	})

	// Every dashboard query returns series (rates need two scrapes in
	// their window: poll).
	for _, scope := range []string{handlerName, ".*"} {
		for _, tg := range targets {
			expr := expandDashboardVars(tg.expr, scope)
			testkit.EventuallyEvery(t, time.Minute, promPoll, "the panel's series", func() error {
				n, err := prom.series(expr)
				if err != nil {
					return fmt.Errorf("panel %q, query %s: %w", tg.panel, tg.refID, err)
				}
				if n == 0 {
					return fmt.Errorf("panel %q, query %s, $scope=%s: no series from %s", tg.panel, tg.refID, scope, expr)
				}
				return nil
			})
		}
	}

	// alerts.yml loaded and evaluated on the scraped series: every rule is
	// healthy, and the recorded series exist.
	testkit.EventuallyEvery(t, time.Minute, promPoll, "every alert rule healthy", func() error {
		var rules struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := prom.get("/api/v1/rules", nil, &rules); err != nil {
			return err
		}
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" {
					return fmt.Errorf("rule %s of group %s: health %q %s", r.Name, g.Name, r.Health, r.LastError)
				}
			}
		}
		if n != 7 {
			return fmt.Errorf("Prometheus loaded %d rules from %s, want its 7", n, alertsFile)
		}
		return nil
	})
	for _, rec := range []string{"dedup:hit_ratio:rate5m", "dedup:store_error_ratio:rate1m"} {
		testkit.EventuallyEvery(t, time.Minute, promPoll, "the recorded series", func() error {
			n, err := prom.series(fmt.Sprintf("%s{scope=%q}", rec, handlerName))
			if err == nil && n == 0 {
				err = fmt.Errorf("recording rule %s: no series", rec)
			}
			return err
		})
	}
}

// promPoll is how often a test asks Prometheus again.
const promPoll = 200 * time.Millisecond

// process is a program a test runs in the background: its output is
// kept, and it is stopped (SIGTERM, or SIGINT for the example, then
// SIGKILL) when the test ends.
type process struct {
	name   string
	cmd    *exec.Cmd
	stop   os.Signal
	out    *outputWatch // stdout
	err    *outputWatch // stderr
	both   *outputWatch // both, as written
	exited chan struct{}
}

func startProcess(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	both := newOutputWatch(nil)
	p := &process{
		name: name, cmd: exec.Command(bin, args...), stop: syscall.SIGTERM,
		both: both, out: newOutputWatch(both), err: newOutputWatch(both),
		exited: make(chan struct{}),
	}
	if name == "router_example" {
		p.stop = os.Interrupt // its Ctrl-C, which ends -linger
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.err
	return p
}

func (p *process) start(t *testing.T) {
	t.Helper()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(p.stop)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop within 30s of %v: killed", p.name, p.stop)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
}

// await waits for re to match w, its stdout or stderr, and returns the
// submatches.
func (p *process) await(t *testing.T, w *outputWatch, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	m, err := w.await(re, p.exited, timeout)
	if err != nil {
		t.Fatalf("%s: %v\n--- output (last 3000 bytes) ---\n%s", p.name, err, tail(p.both.String(), 3000))
	}
	return m
}

// outputWatch is an io.Writer that keeps what is written and wakes those
// waiting for it.
type outputWatch struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
	also    io.Writer
}

func newOutputWatch(also io.Writer) *outputWatch {
	return &outputWatch{changed: make(chan struct{}), also: also}
}

func (o *outputWatch) Write(p []byte) (int, error) {
	if o.also != nil {
		_, _ = o.also.Write(p)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	close(o.changed)
	o.changed = make(chan struct{})
	return len(p), nil
}

func (o *outputWatch) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// await returns the submatches of re's first match, once written; an
// error when the process exits first or timeout passes.
func (o *outputWatch) await(re *regexp.Regexp, exited <-chan struct{}, timeout time.Duration) ([]string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		o.mu.Lock()
		m := re.FindStringSubmatch(o.buf.String())
		changed := o.changed
		o.mu.Unlock()
		if m != nil {
			return m, nil
		}
		select {
		case <-changed:
		case <-exited:
			o.mu.Lock()
			m := re.FindStringSubmatch(o.buf.String())
			o.mu.Unlock()
			if m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("exited before writing %s", re)
		case <-timer.C:
			return nil, fmt.Errorf("wrote no %s within %s", re, timeout)
		}
	}
}

// prometheusServer is a Prometheus server of the test's own.
type prometheusServer struct {
	base string // http://127.0.0.1:port
}

// startPrometheus runs a Prometheus server with the given configuration
// (and copies of the files it names, such as its rule files), its storage
// in a temporary directory, on a free loopback port it picks itself (never
// :9090, where a packaged server may listen), until the test ends.
func startPrometheus(t *testing.T, bin, config string, files ...string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(requireBinary(t, "promtool"), "check", "config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, config)
	}
	p := startProcess(t, "prometheus", bin,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0",
	)
	p.start(t) // stopped (SIGTERM) before dir is removed
	addr := p.await(t, p.err, regexp.MustCompile(`msg="Listening on" address=(127\.0\.0\.1:\d+)`), 2*time.Minute)[1]
	s := &prometheusServer{base: "http://" + addr}
	testkit.EventuallyEvery(t, 2*time.Minute, promPoll, "Prometheus ready", func() error {
		resp, err := http.Get(s.base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	})
	return s
}

// get calls the HTTP API and decodes the data of a success into data.
func (s *prometheusServer) get(path string, q url.Values, data any) error {
	u := s.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s: %s: %s", path, resp.Status, body.ErrorType, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

// instantVector is the data of an instant query returning a vector.
type instantVector struct {
	ResultType string `json:"resultType"`
	Result     []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	} `json:"result"`
}

func (s *prometheusServer) query(expr string) (instantVector, error) {
	var v instantVector
	if err := s.get("/api/v1/query", url.Values{"query": {expr}}, &v); err != nil {
		return v, fmt.Errorf("query %s: %w", expr, err)
	}
	if v.ResultType != "vector" {
		return v, fmt.Errorf("query %s: result type %s, want vector", expr, v.ResultType)
	}
	return v, nil
}

// series is how many series expr returns now.
func (s *prometheusServer) series(expr string) (int, error) {
	v, err := s.query(expr)
	return len(v.Result), err
}

// scalar is the value of the one series expr returns now.
func (s *prometheusServer) scalar(expr string) (float64, error) {
	v, err := s.query(expr)
	if err != nil {
		return 0, err
	}
	if len(v.Result) != 1 {
		return 0, fmt.Errorf("query %s: %d series, want 1", expr, len(v.Result))
	}
	str, ok := v.Result[0].Value[1].(string)
	if !ok {
		return 0, errors.New("query " + expr + ": value is not a string")
	}
	f, err := strconv.ParseFloat(str, 64)
	if err == nil && math.IsNaN(f) {
		err = fmt.Errorf("query %s: NaN", expr)
	}
	return f, err
}
