package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// RedisTap is a go-redis hook that calls itself with the commands of
// every round trip before sending them: a command sent alone as a slice
// of one, a pipeline whole. Dials pass through.
type RedisTap func(cmds []redis.Cmder)

var _ redis.Hook = RedisTap(nil)

func (f RedisTap) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f RedisTap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (f RedisTap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		f(cmds)
		return next(ctx, cmds)
	}
}
