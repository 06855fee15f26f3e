package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// teardown is a stack of named steps run in reverse order, like
// testing.T.Cleanup: what was opened last is closed first.
type teardown struct {
	steps []teardownStep
}

type teardownStep struct {
	name string
	fn   func(context.Context) error
}

func (t *teardown) add(name string, fn func(context.Context) error) {
	t.steps = append(t.steps, teardownStep{name, fn})
}

// run runs every step, newest first, even after a failure, and returns
// the failures joined. Each step is bounded by perStep.
func (t *teardown) run(ctx context.Context, perStep time.Duration) error {
	var errs []error
	for i := len(t.steps) - 1; i >= 0; i-- {
		s := t.steps[i]
		sctx, cancel := context.WithTimeout(ctx, perStep)
		if err := s.fn(sctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
		cancel()
	}
	t.steps = nil
	return errors.Join(errs...)
}

// names lists the steps, oldest first (what -cleanup would remove).
func (t *teardown) names() []string {
	out := make([]string, 0, len(t.steps))
	for _, s := range t.steps {
		out = append(out, s.name)
	}
	return out
}

// unreachableError says which service could not be used, at which
// address, and which flag (or environment variable) changes it: either
// nothing answered there, or the server answered and refused (a wrong
// password, an unknown role, database or virtual host).
type unreachableError struct {
	service string
	addr    string
	setting string
	err     error
}

func (e *unreachableError) Error() string {
	if refusal := serverRefusal(e.err); refusal != nil {
		what := "user, password and database"
		if e.service == "RabbitMQ" {
			what = "user, password and virtual host"
		}
		return fmt.Sprintf("%s at %s refused the connection (check the %s in %s): %v", e.service, e.addr, what, e.setting, refusal)
	}
	// The dial error alone: a client may list every attempt, on lines of
	// their own.
	cause := e.err
	var dial *net.OpError
	if errors.As(cause, &dial) {
		cause = dial
	}
	return fmt.Sprintf("%s is not reachable at %s (change it with %s): %v", e.service, e.addr, e.setting, cause)
}

// serverRefusal returns the error a server answered with, found in err's
// chain, or nil when err is not one (nothing answered, or a timeout).
func serverRefusal(err error) error {
	var (
		pg    *pgconn.PgError
		my    *mysql.MySQLError
		amqp  *amqp091.Error
		redis redis.Error
	)
	switch {
	case errors.As(err, &pg):
		return pg
	case errors.As(err, &my):
		return my
	case errors.As(err, &amqp):
		return amqp
	case errors.As(err, &redis):
		return redis
	}
	return nil
}

func (e *unreachableError) Unwrap() error { return e.err }

// dialTimeout bounds the reachability probe of every service.
const dialTimeout = 3 * time.Second

// probeTCP checks that something listens at addr before a client library
// starts its own (sometimes endless) reconnect loop.
func probeTCP(ctx context.Context, service, addr, setting string) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return &unreachableError{service, addr, setting, err}
	}
	return c.Close()
}

// redactURL hides the password of a URL for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// urlHostPort is the host:port of a URL, with the scheme's default port.
func urlHostPort(raw, defaultPort string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", fmt.Errorf("no host in %q", redactURL(raw))
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), defaultPort), nil
	}
	return u.Host, nil
}
