package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// The CPU a message costs: this process's (the consumer, with kfake's
// in-process broker when that is the broker), Redis's and the PostgreSQL
// backends' of the harness's own connections.

// selfCPU returns the CPU time this process has used, user and system,
// from its own rusage.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU time the Redis server has used, user and
// system, from INFO cpu (its main thread and the others). The shared
// server also serves whatever else runs on the machine: the figure is an
// upper bound of the harness's share.
func redisCPU(ctx context.Context, c redis.UniversalClient) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
				}
				total += f
				found++
			}
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_sys and used_cpu_user")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// pgAppName is the application_name of the harness's own PostgreSQL
// connections (the e2e stores' and the writing handler's), by which
// pgBackends finds their server processes.
var pgAppName = "dedup_bench_" + runID()

// pgBenchDSN is the PostgreSQL DSN with pgAppName as application_name.
func pgBenchDSN() string {
	u, err := url.Parse(testkit.PostgresDSN())
	if err != nil || u.Scheme == "" {
		return testkit.PostgresDSN()
	}
	q := u.Query()
	q.Set("application_name", pgAppName)
	u.RawQuery = q.Encode()
	return u.String()
}

// pgBackends returns the CPU time each server process of the harness's
// PostgreSQL connections (pg_stat_activity by application_name) has
// used, by pid, from /proc/<pid>/schedstat (nanoseconds on the CPU).
// PostgreSQL must run on this machine.
func pgBackends(ctx context.Context, db *sql.DB) (map[int]time.Duration, error) {
	rows, err := db.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", pgAppName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cpu := map[int]time.Duration{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL backend %d: %w (is the server on this machine?)", pid, err)
		}
		f := bytes.Fields(b)
		if len(f) < 1 {
			return nil, fmt.Errorf("PostgreSQL backend %d: empty schedstat", pid)
		}
		ns, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return nil, err
		}
		cpu[pid] = time.Duration(ns)
	}
	return cpu, rows.Err()
}

// cpuMeter samples the CPU figures of a run: this process's always,
// Redis's and PostgreSQL's when set.
type cpuMeter struct {
	redis redis.UniversalClient
	pg    *sql.DB
}

// cpuSample is the meter's reading at one moment.
type cpuSample struct {
	self  time.Duration
	redis time.Duration
	pg    map[int]time.Duration
	err   error
}

// servers reads the servers' figures into s (the slow part of a sample:
// a round trip each).
func (m *cpuMeter) servers(ctx context.Context, s *cpuSample) {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if m.redis != nil {
		r, err := redisCPU(ctx, m.redis)
		s.redis = r
		if err != nil {
			s.err = err
		}
	}
	if m.pg != nil {
		p, err := pgBackends(ctx, m.pg)
		s.pg = p
		if err != nil {
			s.err = err
		}
	}
}

// cpuUsed is what a run used between two samples.
type cpuUsed struct {
	self, redis, pg time.Duration
	hasRedis, hasPG bool
}

func (m *cpuMeter) used(a, b cpuSample) (cpuUsed, error) {
	u := cpuUsed{self: b.self - a.self}
	if err := cmpErr(a.err, b.err); err != nil {
		return u, err
	}
	if m == nil {
		return u, nil
	}
	if m.redis != nil {
		u.redis, u.hasRedis = b.redis-a.redis, true
	}
	if m.pg != nil {
		// A backend that left between the samples is not counted: the
		// pools keep their connections for the whole section.
		for pid, t := range b.pg {
			u.pg += t - a.pg[pid]
		}
		u.hasPG = true
	}
	return u, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
