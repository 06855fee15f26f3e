package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// lane batches the calls to one node (to every node when the keys of a
// call cannot live on several).
type lane struct {
	b *batch.Batcher[op, any]
}

// newLane returns a lane whose pipelines go out through execBatch.
func (s *Store) newLane() *lane {
	l := &lane{}
	l.b = batch.NewFromConfig(func(ctx context.Context, calls []*batch.Call[op, any]) error {
		return s.execBatch(ctx, calls)
	}, batch.Config(s.cfg.Batch))
	l.b.OnOrphaned(undoTimeout, s.undoOrphans)
	return l
}

// laneOf returns the lane of o: nil without batching; the one lane when
// the keys of a call live on one node; else the lane of the node that
// serves o's key, made on first use ("" when no slot map can be read:
// the call then fails in it), or nil once Close has closed the lanes (o
// is then sent on its own).
func (s *Store) laneOf(ctx context.Context, o op) *lane {
	if s.cfg.Batch.Disabled || !s.sharded {
		return s.lane0
	}
	addr := nodeAddr(ctx, s.client, o.firstKey())
	if l, ok := s.lanes.Load(addr); ok {
		return l.(*lane)
	}
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	if s.lanesClosed {
		return nil
	}
	l, _ := s.lanes.LoadOrStore(addr, s.newLane())
	return l.(*lane)
}

// closeLanes stops making lanes, and closes those made (see
// batch.Batcher.Close).
func (s *Store) closeLanes() {
	s.lanesMu.Lock()
	s.lanesClosed = true
	s.lanesMu.Unlock()
	if s.lane0 != nil {
		_ = s.lane0.b.Close(context.Background())
	}
	s.lanes.Range(func(_, l any) bool {
		_ = l.(*lane).b.Close(context.Background())
		return true
	})
}

// run sends one op, batched in its lane unless Batch.Disabled.
//
// Auto-batching: every script call of the store (an [op]) goes through
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
// of its unpipelined one.
//
// Where the keys of the calls live on several nodes (Redis Cluster, a
// Ring), each node has a batcher of its own (a lane), with its own
// MaxInFlight slots: a pipeline carries the calls of one node, so a node
// that is slow to answer, or whose replicas are (WaitReplicas), holds up
// only the calls on its own keys, never those of the other nodes.
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
func (s *Store) run(ctx context.Context, o op) (any, error) {
	var others func(uint64) bool
	if s.waiting() {
		o.trace = traceOf(ctx)
		others = s.watchWaits(nodeAddr(ctx, s.client, o.firstKey()))
	}
	l := s.laneOf(ctx, o)
	if l == nil {
		return s.runOne(ctx, o)
	}
	v, err := l.b.DoLater(ctx, o, stores.Linger(ctx))
	if others != nil && deadlinePassed(ctx) {
		// It left at its deadline while the node's pipelines waited
		// for the node's replicas.
		o.trace.holdIf(err, func() bool { return others(0) })
	}
	return v, err
}

// runOne sends one op on its own: EVALSHA, falling back to EVAL when the
// server does not have the script cached (with WaitReplicas, followed by
// WAIT that answers by ctx's deadline: see runWaited).
func (s *Store) runOne(ctx context.Context, o op) (any, error) {
	if s.waiting() {
		deadline, _ := ctx.Deadline()
		vals, errs := s.runWaited(ctx, []op{o}, deadline)
		return vals[0], errs[0]
	}
	return s.runPlain(ctx, o)
}

// runPlain sends one op on its own, without WAIT.
func (s *Store) runPlain(ctx context.Context, o op) (any, error) {
	var (
		v   any
		err error
	)
	if o.script == nil {
		v, err = s.client.Do(ctx, o.args...).Result()
	} else {
		v, err = o.script.Run(ctx, s.client, o.keys, o.args...).Result()
	}
	return v, err
}

// execBatch is a lane's Exec: one op on its own, several in one
// pipeline. With WaitReplicas, the pipeline's WAIT answers by the
// earliest deadline of its calls.
func (s *Store) execBatch(ctx context.Context, calls []*batch.Call[op, any]) error {
	if len(calls) == 1 {
		calls[0].Set(s.runOne(ctx, calls[0].Req))
		return nil
	}
	ops := make([]op, len(calls))
	var deadline time.Time
	for i, c := range calls {
		ops[i] = c.Req
		if d, ok := c.Context().Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
			deadline = d
		}
	}
	var (
		vals []any
		errs []error
	)
	if s.waiting() {
		vals, errs = s.runWaited(ctx, ops, deadline)
	} else {
		vals, errs = s.runPipelined(ctx, ops)
	}
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
		trace := traceOf(ctx)
		for i := range ops {
			ops[i].trace = trace
		}
		deadline, _ := ctx.Deadline()
		return s.runWaited(ctx, ops, deadline)
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

// runEachNode is runPipelined with one pipeline per node (the node of each
// op's key, in Cluster and Ring), the nodes at once: a node slow to
// answer, or that must be sent a script again (NOSCRIPT), holds up its own
// ops only. The give-backs use it.
func (s *Store) runEachNode(ctx context.Context, ops []op) ([]any, []error) {
	if !s.sharded || len(ops) < 2 {
		return s.runPipelined(ctx, ops)
	}
	groups := map[string][]int{}
	for i, o := range ops {
		addr := nodeAddr(ctx, s.client, o.firstKey())
		groups[addr] = append(groups[addr], i)
	}
	if len(groups) == 1 {
		return s.runPipelined(ctx, ops)
	}
	vals, errs := make([]any, len(ops)), make([]error, len(ops))
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := make([]op, len(idx))
			for j, i := range idx {
				part[j] = ops[i]
			}
			v, e := s.runPipelined(ctx, part)
			for j, i := range idx {
				vals[i], errs[i] = v[j], e[j]
			}
		}()
	}
	wg.Wait()
	return vals, errs
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
		s.runEachNode(ctx, ops)
	}
}
