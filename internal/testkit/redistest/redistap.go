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

// RedisDone is a go-redis hook that calls itself with the commands of
// every round trip after their replies (or errors) have come back.
type RedisDone func(cmds []redis.Cmder)

var _ redis.Hook = RedisDone(nil)

func (f RedisDone) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f RedisDone) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f([]redis.Cmder{cmd})
		return err
	}
}

func (f RedisDone) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f(cmds)
		return err
	}
}
