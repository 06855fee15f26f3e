package acceptance_test

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

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
	acceptance.WriteSummary(os.Stdout)
	os.Exit(code)
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

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
