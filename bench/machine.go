package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes are the machine-wide CPU counters of /proc/stat (Linux), in
// clock ticks.
type cpuTimes struct {
	busy, idle, steal uint64
}

func readCPU() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return cpuTimes{}, err
		}
	}
	// user nice system idle iowait irq softirq steal
	return cpuTimes{busy: v[0] + v[1] + v[2] + v[5] + v[6], idle: v[3] + v[4], steal: v[7]}, nil
}

// since reports how busy the machine was between t0 and t: the share of
// CPU time spent working and the share stolen by the hypervisor for
// other guests, which slows every figure of the run.
func (t cpuTimes) since(t0 cpuTimes) []result {
	busy, idle, steal := t.busy-t0.busy, t.idle-t0.idle, t.steal-t0.steal
	total := busy + idle + steal
	if total == 0 {
		return nil
	}
	pct := func(x uint64) float64 { return float64(x) * 100 / float64(total) }
	return []result{
		{"machine", "machine_cpu_busy_pct", pct(busy), "%", "all CPUs, whole run (this harness, the services and anything else)"},
		{"machine", "machine_cpu_steal_pct", pct(steal), "%", "time the hypervisor gave to other guests"},
	}
}

// loadAvg returns the 1-minute load average of /proc/loadavg (Linux):
// how many processes wanted a CPU, on average, over the last minute.
func loadAvg() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}
