package acceptance_test

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"go.uber.org/goleak"

	"github.com/watermill-dedup/dedup/acceptance"
)

// defaultParallel is how many scenarios run at once unless -test.parallel
// or ACCEPTANCE_PARALLEL says otherwise. Scenarios mostly wait (for
// brokers, leases, redeliveries), so more than the two cores of the
// machine keeps the suite short without starving it.
const defaultParallel = 8

func TestMain(m *testing.M) {
	flag.Parse()
	if !acceptance.IsChild() && !flagSet("test.parallel") {
		p := defaultParallel
		if v, err := strconv.Atoi(os.Getenv("ACCEPTANCE_PARALLEL")); err == nil && v > 0 {
			p = v
		}
		if err := flag.Set("test.parallel", strconv.Itoa(p)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if !acceptance.IsChild() {
		// Every consumer, subscriber, store and broker of every scenario
		// was stopped: nothing may keep running.
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "acceptance: goroutines still running after the tests: %v\n", err)
			code = 1
		}
	}
	acceptance.WriteSummary(os.Stdout)
	if path := os.Getenv("ACCEPTANCE_SUMMARY"); path != "" && !acceptance.IsChild() {
		if err := writeSummaryFile(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignores what the libraries under test leave running by
// design, each for a stated reason.
var leakOptions = []goleak.Option{
	// Sarama's metrics registry (rcrowley/go-metrics) starts one ticker
	// per process, on the first meter, that nothing can stop.
	goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
}

// testLogger logs the backends' clients when ACCEPTANCE_LOG is set (see
// the package doc).
func testLogger() watermill.LoggerAdapter {
	switch os.Getenv("ACCEPTANCE_LOG") {
	case "trace":
		return watermill.NewStdLogger(true, true)
	case "debug":
		return watermill.NewStdLogger(true, false)
	case "info":
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

// writeSummaryFile writes the summary to path: go test shows a passing
// package's output only with -v.
func writeSummaryFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	acceptance.WriteSummary(f)
	return f.Close()
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
