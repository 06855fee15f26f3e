package storeopen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// SetRedisLogger routes go-redis's own log lines (a pool's failed dials,
// a cluster's moved slots) to logger, at info level, or discards them
// with a nil logger: otherwise go-redis prints them raw on stderr, beside
// the error storeopen returns, which says the same. go-redis has one
// logger for the whole process (redis.SetLogger) and none of a client's
// own: a program calls this once, before it opens Redis.
func SetRedisLogger(logger watermill.LoggerAdapter) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	redis.SetLogger(redisLog{logger})
}

// redisLog is go-redis's logger interface on a watermill logger.
type redisLog struct{ l watermill.LoggerAdapter }

func (r redisLog) Printf(_ context.Context, format string, v ...any) {
	r.l.Info("go-redis: "+strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "), nil)
}

// NotTLSError is a server that did not complete a TLS handshake: it may
// not speak TLS at all (a rediss:// URL to a Redis without TLS, which
// waits in silence for the end of a command the handshake never sends).
type NotTLSError struct {
	// What happened: "no answer within 3s", "it answered, but not in TLS".
	What string
	Err  error
}

func (e *NotTLSError) Error() string {
	return "the server did not complete a TLS handshake (" + e.What + "): maybe it does not speak TLS; a Redis without TLS takes a redis:// URL"
}

func (e *NotTLSError) Unwrap() error { return e.Err }

// probeTLS makes a TLS handshake with addr as the client will, within
// the dial time-out, and returns a *NotTLSError when the server does not
// complete it: no answer, an answer that is no TLS, or the connection
// closed. go-redis would wait out its own time-out and report "no
// answer". A handshake that fails otherwise (a certificate not trusted,
// refused) is left to the client, which reports it as it dials.
func (o Opener) probeTLS(ctx context.Context, addr string, cfg *tls.Config) error {
	timeout := o.dialTimeout()
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(hctx, "tcp", addr)
	if err == nil {
		return c.Close()
	}
	var header tls.RecordHeaderError
	switch {
	case ctx.Err() != nil:
		return nil // the caller's: the client's ping returns it
	case errors.Is(err, context.DeadlineExceeded):
		return &NotTLSError{What: fmt.Sprintf("no answer within %s", timeout), Err: err}
	case errors.As(err, &header):
		return &NotTLSError{What: fmt.Sprintf("it answered, but not in TLS: %q", header.RecordHeader[:]), Err: err}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return &NotTLSError{What: "it closed the connection", Err: err}
	}
	return nil
}
