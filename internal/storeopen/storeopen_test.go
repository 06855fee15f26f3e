package storeopen_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/redisclean"
	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// The errors name the service, the address and the setting, and say
// whether nothing answered or the server refused, in each program's words.
func TestUnreachableError(t *testing.T) {
	refused := &pgconn.PgError{Severity: "FATAL", Code: "28000", Message: `role "x" does not exist`}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&storeopen.UnreachableError{Service: "PostgreSQL", Addr: "h:1/db", Setting: storeopen.PostgresSetting, Err: errors.New("dial tcp: refused")},
			"PostgreSQL is not reachable at h:1/db (change it with -postgres-dsn or POSTGRES_DSN): dial tcp: refused"},
		{&storeopen.UnreachableError{Service: "PostgreSQL", Addr: "h:1/db", Setting: storeopen.PostgresSetting, Err: refused},
			"PostgreSQL at h:1/db refused the connection (check -postgres-dsn or POSTGRES_DSN): " + refused.Error()},
		{&storeopen.UnreachableError{Service: "PostgreSQL", Addr: "h:1/db", Setting: storeopen.PostgresSetting, Check: "user, password and database", Err: refused},
			"PostgreSQL at h:1/db refused the connection (check the user, password and database in -postgres-dsn or POSTGRES_DSN): " + refused.Error()},
		{&storeopen.SettingError{Setting: storeopen.MySQLSetting, Err: errors.New("bad")}, "-mysql-dsn or MYSQL_DSN: bad"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}

// amqp091 reports its own failures as *amqp091.Error too: a handshake that
// timed out, a connection closed. They are no refusal (#23: a server that
// never answered was said to have "refused the connection (check the
// user, password and virtual host...)").
func TestServerRefusalAMQP(t *testing.T) {
	timeout := &amqp091.Error{Code: amqp091.FrameError, Reason: "read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout"}
	for _, err := range []error{timeout, amqp091.ErrClosed, fmt.Errorf("cannot connect to AMQP: %w", timeout)} {
		if r := storeopen.ServerRefusal(err); r != nil {
			t.Errorf("ServerRefusal(%v) = %v, want nil: the client gave up, the server said nothing", err, r)
		}
	}
	for _, err := range []error{amqp091.ErrCredentials, amqp091.ErrVhost, amqp091.ErrSASL,
		&amqp091.Error{Code: amqp091.NotAllowed, Reason: "NOT_ALLOWED - vhost nosuchvhost not found", Server: true}} {
		if r := storeopen.ServerRefusal(fmt.Errorf("cannot connect to AMQP: %w", err)); r == nil {
			t.Errorf("ServerRefusal(%v) = nil, want the refusal", err)
		}
	}
	u := &storeopen.UnreachableError{Service: "RabbitMQ", Addr: "h:1", Setting: "-amqp-url or AMQP_URL", Check: "user, password and virtual host", Err: timeout}
	if got, want := u.Error(), "RabbitMQ is not reachable at h:1 (change it with -amqp-url or AMQP_URL): "; !strings.HasPrefix(got, want) || !strings.Contains(got, "i/o timeout") {
		t.Errorf("got  %q\nwant %q and the time-out", got, want)
	}
}

// A Redis that accepts the connection and never answers is "no answer
// within" the time-out, as for the SQL databases, not "context deadline
// exceeded".
func TestOpenerRedisNoAnswer(t *testing.T) {
	hung := testkit.NewProxy(t, testkit.ClosedAddr(t))
	hung.Blackhole()
	_, err := storeopen.Opener{}.Redis(context.Background(), []string{hung.Addr()}, false)
	var u *storeopen.UnreachableError
	if !errors.As(err, &u) || u.Addr != hung.Addr() || !strings.Contains(err.Error(), "Redis is not reachable at "+hung.Addr()) ||
		!strings.Contains(err.Error(), "no answer within "+storeopen.DialTimeout.String()) {
		t.Fatalf("Redis that never answers: %v", err)
	}
}

func TestOpenerUnreachable(t *testing.T) {
	ctx := context.Background()
	addr := testkit.ClosedAddr(t)
	o := storeopen.Opener{MaxConns: 2}
	var u *storeopen.UnreachableError
	if _, err := o.Redis(ctx, []string{addr}, false); !errors.As(err, &u) || u.Addr != addr || u.Setting != storeopen.RedisSetting {
		t.Errorf("Redis on a closed port: %v", err)
	}
	if _, _, err := o.DB(ctx, sqlstore.Postgres, "postgres://postgres@"+addr+"/test"); !errors.As(err, &u) || u.Addr != addr+"/test" || u.Service != "PostgreSQL" {
		t.Errorf("PostgreSQL on a closed port: %v", err)
	}
	if _, _, err := o.DB(ctx, sqlstore.MySQL, "root@tcp("+addr+")/test"); !errors.As(err, &u) || u.Addr != addr+"/test" || u.Service != "MySQL/MariaDB" {
		t.Errorf("MySQL on a closed port: %v", err)
	}
	var s *storeopen.SettingError
	if _, _, err := o.DB(ctx, sqlstore.MySQL, "root@nonsense("); !errors.As(err, &s) || s.Setting != storeopen.MySQLSetting {
		t.Errorf("a bad DSN: %v, want a *SettingError", err)
	}
}

func TestOpenerServices(t *testing.T) {
	ctx := context.Background()
	o := storeopen.Opener{MaxConns: 2}
	for _, tc := range []struct {
		d   sqlstore.Dialect
		dsn string
	}{{sqlstore.Postgres, testkit.RequirePostgres(t)}, {sqlstore.MySQL, testkit.RequireMySQL(t)}} {
		db, addr, err := o.DB(ctx, tc.d, tc.dsn)
		if err != nil {
			t.Fatalf("%s: %v", tc.d, err)
		}
		if !strings.HasSuffix(addr, "/test") || strings.Contains(addr, "@") {
			t.Errorf("%s: address %q, want host:port/test", tc.d, addr)
		}
		if n := db.Stats().MaxOpenConnections; n != 2 {
			t.Errorf("%s: pool of %d, want 2", tc.d, n)
		}
		_ = db.Close()
	}

	client, err := o.Redis(ctx, []string{testkit.RequireRedis(t)}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	prefix := testkit.UniqueName("storeopen:") + ":"
	if _, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 1200 { // more than one batch of deletes
			p.Set(ctx, prefix+strconv.Itoa(i), "v", 0)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	other := prefix[:len(prefix)-1] + "-other"
	if err := client.Set(ctx, other, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	defer client.Del(ctx, other)
	if err := redisclean.DeletePrefix(ctx, client, prefix); err != nil {
		t.Fatal(err)
	}
	if keys, err := client.Keys(ctx, prefix+"*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("%d keys left under %s (%v)", len(keys), prefix, err)
	}
	if err := client.Get(ctx, other).Err(); errors.Is(err, redis.Nil) {
		t.Errorf("a key outside the prefix was deleted")
	}
}

// A PostgreSQL DSN that points at another server, which answers but not
// with the PostgreSQL protocol (here MySQL/MariaDB's port), says so; pgx
// alone says "received unexpected message: %!w(<nil>)".
func TestOpenerPostgresAtAnotherServer(t *testing.T) {
	addr := anystore.RequireStore(t, anystore.StoreMySQL)
	for _, dsn := range []string{
		"postgres://postgres@" + addr + "/test?sslmode=disable",
		"postgres://postgres@" + addr + "/test", // sslmode=prefer: a refused TLS request first
	} {
		_, _, err := storeopen.Opener{MaxConns: 1}.DB(context.Background(), sqlstore.Postgres, dsn)
		var u *storeopen.UnreachableError
		if !errors.As(err, &u) || u.Setting != storeopen.PostgresSetting {
			t.Fatalf("%s: %v, want an *UnreachableError naming %s", dsn, err, storeopen.PostgresSetting)
		}
		var p *storeopen.ProtocolError
		if msg := err.Error(); !errors.As(err, &p) || strings.Contains(msg, "%!") ||
			!strings.Contains(msg, "answered there, but not with the PostgreSQL protocol") {
			t.Errorf("%s: %q, want it to say the server there does not speak PostgreSQL", dsn, msg)
		}
	}
}
