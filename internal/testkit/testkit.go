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

// ServicesRequired reports whether a missing service is a failure rather
// than a skip: CI is set, or DEDUP_REQUIRE_SERVICES=1.
func ServicesRequired() bool {
	return os.Getenv("CI") != "" || os.Getenv("DEDUP_REQUIRE_SERVICES") == "1"
}

// Unavailable skips the test with a loud message naming the service, or
// fails it when services are required.
func Unavailable(t testing.TB, service, addr string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable at %s: %v", service, addr, err)
	if ServicesRequired() {
		t.Fatalf("%s (services are required: CI or DEDUP_REQUIRE_SERVICES=1 is set)", msg)
	}
	t.Skipf("SKIPPED — %s. Start it on its standard loopback port (or point the address variable at it), or set CI=1 / DEDUP_REQUIRE_SERVICES=1 to make this a failure.", strings.ToUpper(msg[:1])+msg[1:])
}

// RequireTCP dials addr and calls Unavailable when nothing answers.
func RequireTCP(t testing.TB, service, addr string) {
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
	RequireTCP(t, "Redis", addr)
	return addr
}

// RequirePostgres returns the PostgreSQL DSN after checking the server
// answers.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	dsn := PostgresDSN()
	RequireTCP(t, "PostgreSQL", hostPort(dsn, "127.0.0.1:5432"))
	return dsn
}

// RequireMySQL returns the MySQL/MariaDB DSN after checking the server
// answers.
func RequireMySQL(t testing.TB) string {
	t.Helper()
	dsn := MySQLDSN()
	RequireTCP(t, "MySQL/MariaDB", mysqlAddr(dsn))
	return dsn
}

// mysqlAddr is the host:port of a go-sql-driver DSN.
func mysqlAddr(dsn string) string {
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
	RequireTCP(t, "RabbitMQ", hostPort(u, "127.0.0.1:5672"))
	return u
}

func hostPort(rawURL, def string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return def
	}
	return u.Host
}
