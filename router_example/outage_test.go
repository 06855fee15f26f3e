package main

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// outageRun is a run of the example whose store sits behind a proxy the
// test cuts from the moment the router runs until the metric outcome
// reaches at least n, and then restores.
type outageRun struct {
	exampleRun
	outcomes int64 // the metric's value when the proxy was restored
}

func runThroughOutage(t *testing.T, proxy *testkit.Proxy, outcome string, n int64, args ...string) outageRun {
	t.Helper()
	bin := buildExample(t)
	args = append([]string{"-cleanup", "-timeout=5m", "-metrics-addr=127.0.0.1:0", "-run-id=" + newTestRunID()}, args...)
	p := startProcess(t, "router_example", bin, args...)
	p.cmd.Env = exampleEnv()
	p.start(t)
	metrics := p.await(t, p.err, regexp.MustCompile(`serving metrics at (http://\S+/metrics)`), 2*time.Minute)[1]
	p.await(t, p.err, startLine, 2*time.Minute) // the router runs
	proxy.Cut()
	re := regexp.MustCompile(`(?m)^dedup_outcomes_total\{outcome="` + outcome + `",scope="loyalty"\} (\d+)$`)
	var got int64
	testkit.WaitFor(t, 3*time.Minute, "outcome "+outcome+" to reach "+strconv.FormatInt(n, 10), func() bool {
		resp, err := http.Get(metrics)
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := re.FindSubmatch(body); m != nil {
			got, _ = strconv.ParseInt(string(m[1]), 10, 64)
		}
		return got >= n
	})
	proxy.Restore()
	p.await(t, p.out, regexp.MustCompile(`(?m)^invariant: .*$`), 5*time.Minute)
	<-p.exited
	r := exampleRun{args: args, code: p.cmd.ProcessState.ExitCode(), stdout: p.out.String(), stderr: p.err.String()}
	return outageRun{exampleRun: r, outcomes: got}
}

// proxiedPostgres is the test database's DSN with its host:port replaced
// by a proxy's.
func proxiedPostgres(t *testing.T) (*testkit.Proxy, string) {
	t.Helper()
	u, err := url.Parse(testkit.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testkit.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	return proxy, u.String()
}

// A store outage under a broker that redelivers at once (RabbitMQ) slows
// the consumer down instead of spinning it: the router retries each
// delivery in process with backoff before it nacks, and logs the outage
// as one incident, not a line a delivery.
func TestExampleStoreOutageBacksOff(t *testing.T) {
	t.Parallel()
	testkit.RequireAMQP(t)
	proxy, dsn := proxiedPostgres(t)
	const storeErrors = 20
	r := runThroughOutage(t, proxy, "store_error", storeErrors,
		"-broker=amqp", "-store=postgres", "-postgres-dsn="+dsn, "-events=200",
		"-fail-rate=0", "-lost-ack-rate=0", "-republish-rate=0")
	requireOK(t, r.exampleRun)
	nacks := regexp.MustCompile(`(?m)^  redelivered .* (\d+) store errors`).FindStringSubmatch(r.stdout)
	if nacks == nil {
		t.Fatalf("the redelivered row names no store-error nacks although the store was down\n%s", r)
	}
	n, _ := strconv.ParseInt(nacks[1], 10, 64)
	// Without retries every failed attempt is a nack and a redelivery
	// (thousands a second); with them, a delivery fails several attempts
	// before it is nacked.
	if n*2 > r.outcomes {
		t.Errorf("%d nacks for %d failed store calls: the router does not retry in process before it nacks\n%s", n, r.outcomes, r)
	}
	if r.count(t, "retried in process") == 0 {
		t.Errorf("no retry in process counted\n%s", r)
	}
	// The retries themselves are logged (as an incident): an outage they
	// absorb is not silent.
	if !strings.Contains(r.stderr, `msg="Error occurred, retrying"`) {
		t.Errorf("no retry logged during the outage\n%s", r)
	}
	// One line for the incident (and a few for distinct causes), not one
	// a failed delivery.
	if lines := strings.Count(r.stderr, "level=ERROR"); lines > 10 {
		t.Errorf("%d ERROR lines for one outage, want at most 10\n%s", lines, r)
	}
}

// Under fail-open a store outage lets handlers run unprotected (bypassed);
// a bypassed run leaves no record, so another delivery of its message
// runs again. The summary checks the documented bound, at most one extra
// award a bypassed run, and says OK (fail-open) within it.
func TestExampleFailOpenWithinItsBound(t *testing.T) {
	t.Parallel()
	proxy := testkit.NewProxy(t, testkit.RequireRedis(t))
	// Every message's first ack is lost: every bypassed message comes
	// again, and runs again, so the run has extra awards to check.
	r := runThroughOutage(t, proxy, "bypassed", 20,
		"-store=redis", "-redis-addr="+proxy.Addr(), "-on-store-error=fail-open", "-events=200",
		"-lost-ack-rate=1", "-fail-rate=0", "-crash-rate=0")
	if r.code != exitOK || !strings.HasPrefix(r.invariant(), "invariant: OK (fail-open) — no payment lost; ") {
		t.Fatalf("want exit 0 and OK (fail-open) after %d bypassed runs, got %q\n%s", r.outcomes, r.invariant(), r)
	}
	extra := regexp.MustCompile(`; (\d+) extra awards, .*\((\d+) bypassed\)`).FindStringSubmatch(r.invariant())
	if extra == nil {
		t.Fatalf("the verdict does not give the extra awards and the bypassed runs: %q", r.invariant())
	}
	e, _ := strconv.Atoi(extra[1])
	b, _ := strconv.Atoi(extra[2])
	if e < 1 || e > b || int64(b) < r.outcomes {
		t.Fatalf("extra %d, bypassed %d (at least %d when the store came back)\n%s", e, b, r.outcomes, r)
	}
	// Every bypassed run's keys are logged for reconciliation: the
	// incident filter holds none of them back.
	if got := strings.Count(r.stderr, "reconcile these keys"); got != b {
		t.Errorf("%d lines name keys to reconcile for %d bypassed runs\n%s", got, b, r)
	}
}
