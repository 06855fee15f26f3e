package testkit

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// verdictTB records how a helper ended the test: failed or skipped, and
// with what message. Fatalf and Skipf end the goroutine, as testing's do.
type verdictTB struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (v *verdictTB) Helper() {}

func (v *verdictTB) Fatalf(format string, args ...any) {
	v.failed, v.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (v *verdictTB) Skipf(format string, args ...any) {
	v.skipped, v.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// verdict runs f with a verdictTB in a goroutine of its own and returns
// how it ended.
func verdict(t *testing.T, f func(tb testing.TB)) *verdictTB {
	v := &verdictTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(v)
	}()
	<-done
	return v
}

// A service that does not answer fails the test, naming it and how to
// start it; DEDUP_SKIP_MISSING=1 skips instead, except under CI.
func TestMissingServiceFailsUnlessSkipIsAsked(t *testing.T) {
	closed := ClosedAddr(t)
	for _, c := range []struct {
		name, skip, ci string
		wantSkip       bool
	}{
		{name: "default", wantSkip: false},
		{name: "skip asked", skip: "1", wantSkip: true},
		{name: "skip asked under CI", skip: "1", ci: "true", wantSkip: false},
		{name: "skip not 1", skip: "yes", wantSkip: false},
		{name: "skip asked, CI=false", skip: "1", ci: "false", wantSkip: true},
		{name: "skip asked, CI=0", skip: "1", ci: "0", wantSkip: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("REDIS_ADDR", closed)
			t.Setenv("DEDUP_SKIP_MISSING", c.skip)
			t.Setenv("CI", c.ci)
			v := verdict(t, func(tb testing.TB) { RequireRedis(tb) })
			if v.skipped != c.wantSkip || v.failed == c.wantSkip {
				t.Fatalf("failed %v, skipped %v; want skipped %v: %s", v.failed, v.skipped, c.wantSkip, v.msg)
			}
			if c.skip == "1" && !c.wantSkip && !strings.Contains(v.msg, "DEDUP_SKIP_MISSING=1 is ignored under CI") {
				t.Errorf("the failure does not say the skip asked for is ignored under CI: %s", v.msg)
			}
			for _, want := range []string{"Redis", closed, "redis-server --daemonize yes", "Debian package redis-server", "REDIS_ADDR"} {
				if !strings.Contains(v.msg, want) {
					t.Errorf("message lacks %q: %s", want, v.msg)
				}
			}
		})
	}
}

// Every service and program the tests look for has a hint saying how to
// start or install it.
func TestEveryMissingThingHasAHint(t *testing.T) {
	for service, want := range map[string]string{
		"Redis":         "Debian package redis-server",
		"PostgreSQL":    "pg_ctlcluster",
		"MySQL/MariaDB": "mariadbd",
		"RabbitMQ":      "rabbitmq-server -detached",
		"NATS":          "nats-server -js",
		"nats-server (to start NATS servers of the test's own)":                  "Debian package nats-server",
		"redis-cli (to create the test Redis Cluster)":                           "redis-tools",
		"redis-server (to start test Redis nodes)":                               "Debian package redis-server",
		"redis-server built with TLS (BUILD_TLS=yes)":                            "built with TLS",
		"openssl (to make test certificates)":                                    "Debian package openssl",
		"promtool (Debian package prometheus)":                                   "Debian package prometheus",
		"mariadbd and mariadb-install-db (to start a MariaDB of the test's own)": "mariadb-server",
		"the PostgreSQL server binaries initdb and postgres":                     "Debian package postgresql",
		"pgx":   "POSTGRES_DSN",
		"mysql": "MYSQL_DSN",
	} {
		if h := startHint(service); !strings.Contains(h, want) {
			t.Errorf("startHint(%q) = %q; want it to contain %q", service, h, want)
		}
	}
}
