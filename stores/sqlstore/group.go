package sqlstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/watermill-dedup/dedup/internal/batch"
	"github.com/watermill-dedup/dedup/stores"
)

// Defaults and bounds of BatchConfig.
const (
	// DefaultMaxBatch is the default BatchConfig.MaxBatch.
	DefaultMaxBatch = 64
	// MaxBatchLimit bounds BatchConfig.MaxBatch.
	MaxBatchLimit = 1000
	// DefaultMaxInFlight is the default BatchConfig.MaxInFlight.
	DefaultMaxInFlight = 1
	// MaxInFlightLimit bounds BatchConfig.MaxInFlight.
	MaxInFlightLimit = 64
)

// BatchConfig configures group commit in lease mode. Concurrent
// single-key Claim, Complete, Release and Extend calls that arrive while
// a batch is running queue, and run together as the next batch: one
// round trip and one commit for all of them, each call still with its own
// result and error.
//
//   - PostgreSQL (pgx): each call's own single-row statement, all in one
//     pipeline (one network write, one implicit transaction, one commit).
//     With another PostgreSQL driver, one transaction of those statements.
//   - MySQL: one transaction: a multi-row INSERT for the claims, a locked
//     read of every record of the batch, one UPDATE or DELETE per kind.
//   - SQLite: one transaction of the calls' statements (one WAL sync).
//
// There is no timer: a call that finds fewer than MaxInFlight batches
// running runs at once, alone, on exactly the statements an unbatched call
// runs, so a lone caller waits for nothing and pays nothing. Only calls
// that would otherwise wait for the database are grouped, and batches grow
// with the load by themselves.
//
// A claim whose record exists is decided from it (Duplicate with its
// data, InProgress); one that must take an expired record over, and any
// call whose batch failed as a whole (a deadlock, a lock wait past 200ms
// on PostgreSQL, a broken connection, one call's bad input), runs again on
// its own statements, in its caller's goroutine. A claim made for a
// caller that gave up while its batch ran is released in the background.
//
// A running batch, or lone call, holds its slot until it ends: one that
// waits for a row lock (a key held by a long transaction, such as an open
// inbox transaction of a handler sharing the scope) holds the calls queued
// behind it. A PostgreSQL batch gives such a wait up after 200ms; a lone
// call, and a MySQL batch, wait as an unbatched call does, up to their
// context's deadline (the middleware's StoreTimeout) or the database's
// lock timeout.
//
// Multi-key calls, and every call on the DailyPartitions layout, always
// run on their own.
//
// Its fields, shared with redisstore.BatchConfig:
//
//   - Disabled turns group commit off: every call runs its own
//     statements on a connection of its own.
//   - MaxBatch is the most calls one batch carries. The default is
//     DefaultMaxBatch (64); at most MaxBatchLimit (1000).
//   - MaxInFlight is how many batches run at once, each on a connection
//     of its own; calls arriving while that many run wait for the next
//     batch. Fewer batches in flight make larger batches (fewer
//     statements and commits per call) and longer waits. The default,
//     DefaultMaxInFlight (1), served the most messages per second and the
//     least CPU per message on every dialect on a two-core machine
//     (README.md); on a server with many cores, 2 to 4 can serve more. At
//     most MaxInFlightLimit (64).
//
// The zero value turns batching on with the defaults.
type BatchConfig = batch.Config

// batchLimits are the defaults and bounds of BatchConfig.
var batchLimits = batch.Limits{
	DefaultMaxBatch: DefaultMaxBatch, MaxBatch: MaxBatchLimit,
	DefaultMaxInFlight: DefaultMaxInFlight, MaxInFlight: MaxInFlightLimit,
}

// group batches a store's single-key lease-mode calls.
type group struct {
	s *Store
	// b delivers each op's error (errFallback: run it on its own); its
	// other results are in the op.
	b *batch.Batcher[*op, struct{}]

	// hook, when set (by tests), sees the size of every batch before it
	// runs; an error it returns stands for a failed batch statement.
	// inDo then counts the calls inside do.
	hook func(n int) error
	inDo atomic.Int64
}

func newGroup(s *Store) *group {
	g := &group{s: s}
	g.b = batch.NewFromConfig(g.exec, s.cfg.Batch)
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
	_, err := g.b.Do(ctx, o)
	if errors.Is(err, errFallback) {
		return g.s.direct(o)
	}
	return err
}

// direct runs o on its own statements under its caller's context, as an
// unbatched store does.
func (s *Store) direct(o *op) error {
	switch o.kind {
	case opClaim:
		o.res = stores.Claim{}
		return s.claimDirect(o.ctx, o.ks, o.token, o.d, &o.res)
	case opComplete:
		return s.completeDirect(o.ctx, o.claim, o.ks, o.token, o.d, o.data)
	case opRelease:
		return s.releaseDirect(o.ctx, o.claim, o.ks, o.token)
	default:
		return s.extendDirect(o.ctx, o.claim, o.ks, o.token, o.d)
	}
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
		ops[0].err = g.s.direct(ops[0])
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
		err = g.s.d.execBatch(ctx, g.s.db, in, g.s.now())
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
		_ = g.s.releaseDirect(ctx, &stores.Claim{Result: stores.Claimed}, o.ks, o.token)
	}
}
