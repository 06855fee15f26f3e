// Command bench measures watermill-dedup against its peers in one run on
// one machine, and prints a table plus machine-readable lines
//
//	RESULT name=value
//
// Usage:
//
//	go run ./bench                 # every section the machine can run
//	go run ./bench -only=middleware,growth
//	go run ./bench -quick          # smaller counts, for a smoke run
//	go run ./bench -only=e2e -brokers=kfake16 -cases=dedup_redis -cpuprofile cpu.prof
//	go run ./bench -only=e2e -brokers=kfake16 -cases=dedup_async_redis -caseprofile /tmp/prof
//
// Sections: middleware (middleware + memstore vs a bare handler vs
// Watermill's Deduplicator), redis (redisstore vs redis-benchmark),
// redis-wait (redisstore with Config.WaitReplicas 1 vs without, on a
// private Redis with a replica), sql
// (sqlstore vs pgbench), e2e (a router on kfake, RabbitMQ and
// watermill-sql with and without dedup, against a hand-rolled SET NX, with
// a handler that writes to PostgreSQL, and the CPU a message costs the
// consumer, Redis and PostgreSQL), replay (a consumer group re-reading
// messages already processed, against the first pass), growth (claim latency as the store fills, and bytes per
// done record at the largest size). A section whose service is unreachable is reported as
// skipped, naming the service. See BENCHMARKS.md for a run and what each
// ratio means.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one measured figure.
type result struct {
	section string
	name    string // RESULT name, e.g. middleware_dedup_ns_per_msg
	value   float64
	unit    string
	note    string
}

type section struct {
	name string
	run  func(ctx context.Context, o *options) ([]result, error)
}

type options struct {
	quick bool
	// brokers and cases, when not empty, pick the e2e brokers and cases
	// to run (plain always runs: the others are measured against it).
	brokers, cases map[string]bool
}

// scale returns n, or n/div under -quick (at least 1).
func (o *options) scale(n, div int) int {
	if o.quick {
		return max(n/div, 1)
	}
	return n
}

var sections = []section{
	{"middleware", runMiddleware},
	{"redis", runRedis},
	{"redis-wait", runRedisWait},
	{"sql", runSQL},
	{"e2e", runE2E},
	{"replay", runReplay},
	{"growth", runGrowth}, // also reports bytes per record
}

func main() {
	only := flag.String("only", "", "comma-separated sections to run (default: all): "+sectionNames())
	quick := flag.Bool("quick", false, "smaller counts, for a smoke run")
	brokers := flag.String("brokers", "", "comma-separated e2e brokers to run (default: all): "+strings.Join(e2eBrokerNames, ","))
	cases := flag.String("cases", "", "comma-separated e2e cases to run besides plain (default: all): "+strings.Join(e2eCaseNames(), ","))
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (this process only) to `file`")
	flag.StringVar(&caseProfiles, "caseprofile", "", "write a CPU profile of each e2e run into `dir`, one file a run: <broker>_<case>_<n>.prof (not with -cpuprofile)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -cpuprofile: %v\n", err)
			os.Exit(2)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	o := &options{
		quick:   *quick,
		brokers: listFlag("brokers", *brokers, e2eBrokerNames),
		cases:   listFlag("cases", *cases, e2eCaseNames()),
	}
	want := listFlag("only", *only, strings.Split(sectionNames(), ","))

	ctx := context.Background()
	var all []result
	cpu0, cpuErr := readCPU()
	load0, loadOK := loadAvg()
	failed := false
	for _, s := range sections {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		start := time.Now()
		fmt.Fprintf(os.Stderr, "bench: %s ...\n", s.name)
		rs, err := s.run(ctx, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			failed = true
		}
		fmt.Fprintf(os.Stderr, "bench: %s done in %s\n", s.name, time.Since(start).Round(time.Millisecond))
		all = append(all, rs...)
	}
	if cpu1, err := readCPU(); err == nil && cpuErr == nil {
		all = append(all, cpu1.since(cpu0)...)
	}
	if load1, ok := loadAvg(); ok && loadOK {
		all = append(all,
			result{"machine", "machine_loadavg_1m_start", load0, "", fmt.Sprintf("processes wanting a CPU, 1-minute average, at the start (%d CPUs)", runtime.NumCPU())},
			result{"machine", "machine_loadavg_1m_end", load1, "", "the same at the end"},
		)
	}
	printTable(all)
	for _, r := range all {
		if r.name != "" {
			fmt.Printf("RESULT %s=%s\n", r.name, formatValue(r.value))
		}
	}
	if failed {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// listFlag splits a comma-separated flag into a set, and exits if a name
// is not one of have.
func listFlag(flagName, value string, have []string) map[string]bool {
	set := map[string]bool{}
	for _, s := range strings.Split(value, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(have, s) {
			fmt.Fprintf(os.Stderr, "bench: -%s: unknown name %q (have %s)\n", flagName, s, strings.Join(have, ","))
			os.Exit(2)
		}
		set[s] = true
	}
	return set
}

func sectionNames() string {
	names := make([]string, len(sections))
	for i, s := range sections {
		names[i] = s.name
	}
	return strings.Join(names, ",")
}

func formatValue(v float64) string {
	switch {
	case v == float64(int64(v)) && v < 1e15:
		return fmt.Sprintf("%d", int64(v))
	case v < 10:
		return fmt.Sprintf("%.3f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

func printTable(rs []result) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SECTION\tMEASURE\tVALUE\tUNIT\tNOTE")
	for _, r := range rs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.section, r.name, formatValue(r.value), r.unit, r.note)
	}
	_ = w.Flush()
}

// skipped reports a section that could not run, loudly.
func skipped(sectionName, why string) []result {
	fmt.Fprintf(os.Stderr, "bench: %s SKIPPED: %s\n", sectionName, why)
	return []result{{section: sectionName, name: "", note: "SKIPPED: " + why}}
}
