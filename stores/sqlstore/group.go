package sqlstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// Group commit of single-key lease-mode calls, on stores/internal/batch:
// the op (one call), and the group that queues ops and hands each batch
// to what it runs them on (the Store, through runner). BatchConfig and
// its bounds are in config.go; each dialect's execBatch runs a batch.

// opKind is the kind of a batched call.
type opKind uint8

const (
	opClaim opKind = iota
	opComplete
	opRelease
	opExtend
	numOpKinds
)

// op is one single-key lease-mode call in a batch. The batch writes its
// results; its caller reads them once the batcher has delivered it (see
// group.do).
type op struct {
	kind  opKind
	ctx   context.Context // the caller's
	ks    keySet          // exactly one id
	claim *stores.Claim   // Complete, Release, Extend: the caller's claim
	token int64
	d     time.Duration // Claim, Extend: lease; Complete: retention
	data  []byte        // Complete

	// Set by the batch.
	res      stores.Claim // Claim: Result, Takeover, Data
	err      error
	fallback bool // undecided: the caller runs it on its own
}

func (o *op) id() recordID { return o.ks.ids[0] }

// runner is what a group runs its calls on: the Store.
type runner interface {
	// direct runs o on its own statements, under its caller's context,
	// as an unbatched call does.
	direct(o *op) error
	// execBatch runs ops, two or more calls on distinct ids in ascending
	// id order, as one batch (see dialect.execBatch).
	execBatch(ctx context.Context, ops []*op) error
}

// group batches a store's single-key lease-mode calls.
type group struct {
	r runner
	// b delivers each op's error (errFallback: run it on its own); its
	// other results are in the op.
	b *batch.Batcher[*op, struct{}]

	// hook, when set (by tests), sees the size of every batch before it
	// runs; an error it returns stands for a failed batch statement.
	// inDo then counts the calls inside do.
	hook func(n int) error
	inDo atomic.Int64
}

// newGroup returns a group that runs its calls on r, in batches as cfg
// bounds them.
func newGroup(r runner, cfg batch.Config) *group {
	g := &group{r: r}
	g.b = batch.NewFromConfig(g.exec, cfg)
	g.b.OnOrphaned(orphanReleaseTimeout, g.orphaned)
	return g
}

// errFallback is the error the batch delivers for an op it could not
// decide: its caller runs it on its own.
var errFallback = errors.New("sqlstore: run the call on its own")

// op returns a new op of kind over ks when g batches it (one key), else
// nil (g may be nil: batching is off).
func (g *group) op(ctx context.Context, kind opKind, ks keySet) *op {
	if g == nil || len(ks.ids) != 1 {
		return nil
	}
	return &op{kind: kind, ctx: ctx, ks: ks}
}

// do runs o in a batch and returns its error; o.res holds a claim's
// result. A call the batch could not decide runs on its own statements
// here, in the caller's goroutine, so it delays no other call.
func (g *group) do(ctx context.Context, o *op) error {
	if g.hook != nil {
		g.inDo.Add(1)
		defer g.inDo.Add(-1)
	}
	// Do returns o's error once the batch has delivered it, and the
	// op's results are then the caller's; or ctx's error as soon as ctx
	// ends, and then a batch still running writes them (a claim it makes
	// is released: see orphaned).
	_, err := g.b.DoLater(ctx, o, stores.Linger(ctx))
	if errors.Is(err, errFallback) {
		return g.r.direct(o)
	}
	return err
}

// exec runs one batch (batch.Exec); the batcher has left out the calls
// whose callers gave up before it started.
func (g *group) exec(ctx context.Context, calls []*batch.Call[*op, struct{}]) error {
	ops := make([]*op, len(calls))
	for i, c := range calls {
		ops[i] = c.Req
	}
	if len(ops) == 1 {
		// Alone: exactly what an unbatched call runs, under its own ctx
		// (a pipeline of one, with the batch settings, would cost a lone
		// call about 10% more latency on PostgreSQL).
		if g.hook != nil {
			_ = g.hook(1)
		}
		ops[0].err = g.r.direct(ops[0])
	} else {
		g.run(ctx, ops)
	}
	for i, c := range calls {
		if o := ops[i]; o.fallback {
			c.Set(struct{}{}, errFallback)
		} else {
			c.Set(struct{}{}, o.err)
		}
	}
	return nil
}

// run decides the ops of a batch of several calls together.
func (g *group) run(ctx context.Context, ops []*op) {
	// Each id at most once per batch: a second call on the same key (two
	// consumers of one message) runs on its own after this batch, and
	// sees its outcome.
	seen := make(map[recordID]struct{}, len(ops))
	in := make([]*op, 0, len(ops))
	for _, o := range ops {
		if _, dup := seen[o.id()]; dup {
			o.fallback = true
			continue
		}
		seen[o.id()] = struct{}{}
		in = append(in, o)
	}
	// Ascending ids: concurrent batches (and multi-key claims) take row
	// locks in one order, so they cannot deadlock on each other's inserts.
	slices.SortFunc(in, func(a, b *op) int { return bytes.Compare(a.ks.ids[0][:], b.ks.ids[0][:]) })
	var err error
	if g.hook != nil {
		err = g.hook(len(in))
	}
	if err == nil {
		err = g.r.execBatch(ctx, in)
	}
	if err != nil {
		// The batch statement (or its transaction) failed, so it changed
		// nothing, or its outcome is unknown after a broken connection.
		// Every call runs on its own: one call's bad input then fails
		// that call only, and a claim whose insert did commit finds its
		// own token and is reported Claimed.
		for _, o := range in {
			o.res, o.err, o.fallback = stores.Claim{}, nil, true
		}
	}
}

// orphanReleaseTimeout bounds the release of a claim nobody waits for.
const orphanReleaseTimeout = 10 * time.Second

// orphaned handles the ops whose callers gave up before their batch
// delivered them; the batcher runs it in the background, and Close waits
// for it. A claim the batch made is released, so a redelivery of the
// message does not find it in progress for a whole lease; anything else
// needs nothing (a Complete that committed is found done by the
// redelivery).
func (g *group) orphaned(ctx context.Context, calls []*batch.Call[*op, struct{}]) {
	for _, c := range calls {
		o := c.Req
		if _, err := c.Result(); err != nil || o.kind != opClaim || o.res.Result != stores.Claimed {
			continue
		}
		rel := &op{kind: opRelease, ctx: ctx, ks: o.ks, claim: &stores.Claim{Result: stores.Claimed}, token: o.token}
		_ = g.r.direct(rel)
	}
}
