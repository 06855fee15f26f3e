package redisstore

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitTrace notes that a store call was held up by the store's own WAITs:
// an op of it went out in a pipeline with a WAIT, or it left its lane at
// its deadline while the node's pipelines waited in theirs.
type waitTrace struct{ held atomic.Bool }

type traceKey struct{}

// traceOf returns the waitTrace of ctx, nil when it has none.
func traceOf(ctx context.Context) *waitTrace {
	t, _ := ctx.Value(traceKey{}).(*waitTrace)
	return t
}

// holdIf marks the call of t (nil: none) held up by WAITs when err, the
// error of a command of it that got no answer, is one a wait for
// replicas causes (waitCut) and others reports a WAIT of another call
// out on the command's node meanwhile: the node's connections, or its
// lane, were taken by pipelines waiting for its replicas.
func (t *waitTrace) holdIf(err error, others func() bool) {
	if t != nil && waitCut(err) && others() {
		t.held.Store(true)
	}
}

// waitCut reports an error that a wait for replicas can cause: a
// deadline, a timeout (a read's, the pool's), no connection left in the
// pool.
func waitCut(err error) bool {
	var ne net.Error
	return err != nil && !errors.Is(err, context.Canceled) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
			errors.Is(err, redis.ErrPoolExhausted) || errors.As(err, &ne) && ne.Timeout())
}

// deadlinePassed reports whether ctx has ended, or its deadline has
// passed: a socket's deadline, the same time, may fire before ctx's own
// timer does.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}
