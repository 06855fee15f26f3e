package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// Auto-batching. Every script call of the store (an [op]) goes through
// run. With batching on (the default), run hands it to a [batch.Batcher]:
// a call that finds one of Batch.MaxInFlight slots free is sent at once,
// alone, in its caller's goroutine and under its caller's context, exactly
// as without batching; calls that arrive while every slot is busy queue
// up, and when a slot frees, everything queued (up to Batch.MaxBatch) goes
// out as one pipeline of EVALSHA calls: the batch size follows the load and
// the round-trip time by itself. A call whose context carries a
// [stores.WithLinger] (a background Complete) is not sent alone while
// another call may soon carry it: it joins the next pipeline, for up to
// the linger.
//
// A pipeline of n calls costs Redis n script runs but one read and one
// write system call on each side instead of n, which is where the time of
// a short script goes: under load this is Redis's pipelined rate instead
// of its unpipelined one. go-redis splits a pipeline per node in Redis
// Cluster (ClusterClient) and per shard in a Ring.
//
// Each op's reply and error are its own: a script error (NOSCRIPT, a
// wrong type) fails that call only. A failure of the pipeline itself (the
// connection) fails every call in it, as it would have failed each call
// sent alone.
//
// Deadlines (see the stores/internal/batch package): a caller whose context ends
// while it waits returns at once with the context's error; a pipeline of
// several calls runs under the latest of their deadlines, so that one
// caller giving up never fails the others. A Claim that succeeds for a
// caller who has already given up is undone by undoOrphans, which the
// Batcher runs in the background, so the message can be claimed again at
// once instead of after its lease.

// run sends one op, batched unless Batch.Disabled.
func (s *Store) run(ctx context.Context, o op) (any, error) {
	if s.batcher != nil {
		return s.batcher.DoLater(ctx, o, stores.Linger(ctx))
	}
	return s.runOne(ctx, o)
}

// runOne sends one op on its own: EVALSHA, falling back to EVAL when the
// server does not have the script cached (with WaitReplicas, followed by
// WAIT: see runWaited).
func (s *Store) runOne(ctx context.Context, o op) (any, error) {
	if s.waiting() {
		vals, errs := s.runWaited(ctx, []op{o})
		return vals[0], errs[0]
	}
	var (
		v   any
		err error
	)
	if o.script == nil {
		v, err = s.client.Do(ctx, o.args...).Result()
	} else {
		v, err = o.script.Run(ctx, s.client, o.keys, o.args...).Result()
	}
	s.heard(err)
	return v, err
}

// execBatch is the Batcher's Exec: one op on its own, several in one
// pipeline.
func (s *Store) execBatch(ctx context.Context, calls []*batch.Call[op, any]) error {
	if len(calls) == 1 {
		calls[0].Set(s.runOne(ctx, calls[0].Req))
		return nil
	}
	ops := make([]op, len(calls))
	for i, c := range calls {
		ops[i] = c.Req
	}
	vals, errs := s.runAll(ctx, ops)
	for i, c := range calls {
		c.Set(vals[i], errs[i])
	}
	return nil
}

// runAll sends ops in one pipeline (go-redis splits it per node in Redis
// Cluster; with WaitReplicas the store does, and ends each node's part
// with WAIT: see runWaited) and returns each op's reply and error.
func (s *Store) runAll(ctx context.Context, ops []op) ([]any, []error) {
	if s.waiting() {
		return s.runWaited(ctx, ops)
	}
	return s.runPipelined(ctx, ops)
}

// runPipelined sends ops in one pipeline, without WAIT, and returns each
// op's reply and error. Ops that failed because a node did not have the
// script cached are sent again with EVAL. The undos of claims and
// fenced calls use it directly: what they give back need not reach the
// replicas (a claim given back that a failover brings back runs out
// with its lease, and no handler ran for it).
func (s *Store) runPipelined(ctx context.Context, ops []op) ([]any, []error) {
	vals, errs := make([]any, len(ops)), make([]error, len(ops))
	cmds := make([]*redis.Cmd, len(ops))
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, o := range ops {
			if o.script == nil {
				cmds[i] = p.Do(ctx, o.args...)
			} else {
				cmds[i] = o.script.EvalSha(ctx, p, o.keys, o.args...)
			}
		}
		return nil
	})
	var retry []int
	for i, cmd := range cmds {
		vals[i], errs[i] = cmd.Result()
		s.heard(errs[i])
		if ops[i].script != nil && errs[i] != nil && isNoScript(errs[i]) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range retry {
				cmds[i] = ops[i].script.Eval(ctx, p, ops[i].keys, ops[i].args...)
			}
			return nil
		})
		for _, i := range retry {
			vals[i], errs[i] = cmds[i].Result()
		}
	}
	return vals, errs
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// isSetNXGetRefused reports the reply of a Redis older than 7.0 to SET NX
// GET, "ERR syntax error" (HasErrorPrefix drops the "ERR "). Server errors
// reach go-redis as text only.
func isSetNXGetRefused(err error) bool {
	return redis.HasErrorPrefix(err, "syntax error")
}

// undoOrphans undoes the claims that succeeded for callers who had
// already given up (their context ended while the pipeline was out):
// nobody holds their tokens, so without this the message could not be
// claimed again until the lease ran out. Only claims matter: a Complete,
// Extend or Release that applied for a caller who has gone is what the
// caller asked for; the caller retries, or the lease runs out, as after
// any timeout. The Batcher runs it in the background, bounded by
// undoTimeout (see batch.Batcher.OnOrphaned); after Close, orphaned claims
// are left to their leases.
func (s *Store) undoOrphans(ctx context.Context, calls []*batch.Call[op, any]) {
	var ops []op
	for _, c := range calls {
		v, err := c.Result()
		ops = append(ops, claimUndo(c.Req, v, err)...)
		ops = append(ops, undoOf(err)...) // a claim not replicated
	}
	if len(ops) > 0 {
		s.runPipelined(ctx, ops)
	}
}
