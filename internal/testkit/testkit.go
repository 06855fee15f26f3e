package testkit

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit/base"
)

// Service addresses, with their environment overrides.
const (
	DefaultRedisAddr   = "127.0.0.1:6379"
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true&multiStatements=false"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// RedisAddr is REDIS_ADDR or 127.0.0.1:6379.
func RedisAddr() string { return env("REDIS_ADDR", DefaultRedisAddr) }

// PostgresDSN is POSTGRES_DSN or the local test database.
func PostgresDSN() string { return env("POSTGRES_DSN", DefaultPostgresDSN) }

// MySQLDSN is MYSQL_DSN (go-sql-driver form) or the local test database.
func MySQLDSN() string { return env("MYSQL_DSN", DefaultMySQLDSN) }

// AMQPURL is AMQP_URL or the local RabbitMQ.
func AMQPURL() string { return env("AMQP_URL", DefaultAMQPURL) }

// skipMissing reports whether the user asked for a missing service to skip
// its tests rather than fail them: DEDUP_SKIP_MISSING=1, outside CI (CI
// never goes green by skipping).
func skipMissing() bool {
	return skipAsked() && !underCI()
}

func skipAsked() bool { return os.Getenv("DEDUP_SKIP_MISSING") == "1" }

// underCI reports whether CI is set to anything but empty, 0 or false.
func underCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "", "0", "false":
		return false
	}
	return true
}

// Unavailable fails the test with a message naming the service, where it
// was looked for and how to start it; with DEDUP_SKIP_MISSING=1 it skips
// the test with that message instead.
func Unavailable(t testing.TB, service, addr string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not available at %s: %v", service, addr, err)
	if h := startHint(service); h != "" {
		msg += "; " + h
	}
	Missing(t, msg)
}

// Missing fails the test with msg, which names what is missing, or skips
// it with msg under DEDUP_SKIP_MISSING=1.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if skipMissing() {
		t.Skipf("SKIPPED (DEDUP_SKIP_MISSING=1) — %s", msg)
	}
	if skipAsked() {
		t.Fatalf("%s (DEDUP_SKIP_MISSING=1 is ignored under CI)", msg)
	}
	t.Fatalf("%s (DEDUP_SKIP_MISSING=1 skips the tests that need it instead)", msg)
}

// startHints says how to get each service or program the tests use, by a
// word its name in Unavailable contains (the first match wins).
var startHints = []struct{ word, hint string }{
	{"redis-server built with TLS", "install a redis-server built with TLS (Debian package redis-server)"},
	{"redis-cli", "install redis-cli (Debian package redis-tools)"},
	{"redis-server", "install redis-server (Debian package redis-server)"},
	{"Redis", "start it: redis-server --daemonize yes --port 6379 --save '' (Debian package redis-server), or set REDIS_ADDR"},
	{"initdb", "install the PostgreSQL server (Debian package postgresql)"},
	{"postgres user", "create the user postgres (Debian package postgresql does)"},
	{"PostgreSQL", "start it: pg_ctlcluster <version> main start (Debian package postgresql), or set POSTGRES_DSN"},
	{"postgres", "start PostgreSQL: pg_ctlcluster <version> main start (Debian package postgresql), or set POSTGRES_DSN"},
	{"pgx", "start PostgreSQL: pg_ctlcluster <version> main start (Debian package postgresql), or set POSTGRES_DSN"},
	{"mariadbd", "install mariadbd and mariadb-install-db (Debian package mariadb-server)"},
	{"MySQL", "start it: start-stop-daemon --start --background --exec /usr/sbin/mariadbd (Debian package mariadb-server), or set MYSQL_DSN"},
	{"mysql", "start MariaDB: start-stop-daemon --start --background --exec /usr/sbin/mariadbd (Debian package mariadb-server), or set MYSQL_DSN"},
	{"RabbitMQ", "start it: rabbitmq-server -detached (Debian package rabbitmq-server), or set AMQP_URL"},
	{"Go module proxy", "let go install reach the Go module proxy (GOPROXY) once, or set NATS_SERVER_CURRENT to a nats-server 2.11 or later"},
	{"NATS_SERVER_CURRENT", "set NATS_SERVER_CURRENT to a nats-server 2.11 or later, or unset it to build one"},
	{"nats-server", "install nats-server (Debian package nats-server)"},
	{"NATS", "start it: nats-server -js -a 127.0.0.1 -p 4222 (Debian package nats-server), or set NATS_URL"},
	{"openssl", "install openssl (Debian package openssl)"},
	{"prometheus", "install prometheus and promtool (Debian package prometheus)"},
	{"promtool", "install prometheus and promtool (Debian package prometheus)"},
	{"pgbench", "install pgbench (Debian package postgresql-<version>, the server, which has it: postgresql-15 on Debian 12)"},
	{"redis-benchmark", "install redis-benchmark (Debian package redis-tools)"},
}

// startHint is how to start or install service, or "" when the kit does
// not know it.
func startHint(service string) string {
	for _, h := range startHints {
		if strings.Contains(service, h.word) {
			return h.hint
		}
	}
	return ""
}

// requireTCP dials addr and calls Unavailable when nothing answers.
func requireTCP(t testing.TB, service, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		Unavailable(t, service, addr, err)
		return
	}
	_ = c.Close()
}

// ClosedAddr returns a loopback host:port nothing listens on: a service
// that is down, for a test of what a client says then (base.ClosedAddr).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	return base.ClosedAddr(t)
}

// RequireRedis returns the Redis address after checking it answers.
func RequireRedis(t testing.TB) string {
	t.Helper()
	addr := RedisAddr()
	requireTCP(t, "Redis", addr)
	return addr
}

// RequirePostgres returns the PostgreSQL DSN after checking the server
// answers.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	dsn := PostgresDSN()
	requireTCP(t, "PostgreSQL", HostPort(dsn, "127.0.0.1:5432"))
	return dsn
}

// RequireMySQL returns the MySQL/MariaDB DSN after checking the server
// answers.
func RequireMySQL(t testing.TB) string {
	t.Helper()
	dsn := MySQLDSN()
	requireTCP(t, "MySQL/MariaDB", MySQLAddr(dsn))
	return dsn
}

// MySQLAddr is the host:port of a go-sql-driver DSN.
func MySQLAddr(dsn string) string {
	addr := "127.0.0.1:3306"
	if i := strings.Index(dsn, "tcp("); i >= 0 {
		if j := strings.Index(dsn[i:], ")"); j > 0 {
			addr = dsn[i+4 : i+j]
		}
	}
	return addr
}

// RequireAMQP returns the RabbitMQ URL after checking the server answers.
func RequireAMQP(t testing.TB) string {
	t.Helper()
	u := AMQPURL()
	requireTCP(t, "RabbitMQ", HostPort(u, "127.0.0.1:5672"))
	return u
}

func HostPort(rawURL, def string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return def
	}
	return u.Host
}

// DefaultNATSURL is the NATS server (with JetStream) the natsstore tests
// use unless NATS_URL says otherwise.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSURL is NATS_URL or nats://127.0.0.1:4222.
func NATSURL() string { return env("NATS_URL", DefaultNATSURL) }

// NATSAddr is the host:port of NATSURL.
func NATSAddr() string { return HostPort(NATSURL(), "127.0.0.1:4222") }

// RequireNATS returns the NATS URL after checking the server answers, or
// fails the test naming it when it does not (see Unavailable). JetStream must be enabled on it (nats-server -js).
func RequireNATS(t testing.TB) string {
	t.Helper()
	u := NATSURL()
	requireTCP(t, "NATS", NATSAddr())
	return u
}

// LastLines returns the last n of lines (all of them when fewer).
func LastLines(lines []string, n int) []string {
	return lines[max(len(lines)-n, 0):]
}
