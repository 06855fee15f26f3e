package stores

import (
	"context"
	"time"
)

// lingerKey is the context key of WithLinger.
type lingerKey struct{}

// WithLinger returns a copy of ctx telling a store that its calls made
// with it need not go out at once: nobody waits for them on a message's
// path (the middleware's background Complete in ModeAsyncComplete). A
// store that batches its calls may hold such a call back for up to d, to
// send it in one round trip with the next call that goes out anyway (on
// a sequential consumer, the claim of the next message); one that does
// not batch ignores it. The call's context still bounds it as usual. A d
// of zero or less is no linger.
func WithLinger(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, lingerKey{}, d)
}

// Linger returns how long a store may hold back a call made with ctx
// (see WithLinger): zero when it must go out at once.
func Linger(ctx context.Context) time.Duration {
	d, _ := ctx.Value(lingerKey{}).(time.Duration)
	return max(d, 0)
}
