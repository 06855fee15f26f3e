package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

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
		s := g.s
		switch s.cfg.Dialect {
		case Postgres:
			err = s.batchPostgres(ctx, in)
		case MySQL:
			err = s.inTx(ctx, func(tx *sql.Tx) error { return s.batchMySQL(ctx, tx, in) })
		default:
			err = s.batchTx(ctx, in)
		}
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

// decideClaim applies the state machine to the existing record r of a
// batched claim that did not insert its row: true when decided (Duplicate
// or InProgress), false for an expired record (a takeover).
func decideClaim(o *op, r record) bool {
	switch {
	case r.live && r.state == stateDone:
		o.res.Result, o.res.Data = stores.Duplicate, r.data
	case r.live:
		o.res.Result = stores.InProgress
	default:
		return false
	}
	return true
}

// opStatement is the single-row statement that runs o on its own (the
// statement an unbatched call runs first), and its arguments.
func (s *Store) opStatement(o *op, now time.Time) (string, []any) {
	q := s.q
	id := q.idArg(o.id())
	switch o.kind {
	case opClaim:
		return q.insertProcessing, []any{id, o.token, q.timeArg(now.Add(o.d))}
	case opComplete:
		return q.complete(1), []any{q.timeArg(now.Add(o.d)), dataArg(o.data), o.token, id}
	case opRelease:
		return q.release(1), []any{o.token, id}
	default:
		return q.extend(1), []any{q.timeArg(now.Add(o.d)), o.token, id}
	}
}

// applied records the rows affected by o's statement: a claim that
// inserted its record is Claimed (one that did not is returned as a
// conflict, for resolveClaims); a fenced call that matched nothing lost
// its claim.
func applied(o *op, n int64) (conflict bool) {
	switch {
	case o.kind == opClaim && n == 1:
		o.res.Result = stores.Claimed
	case o.kind == opClaim:
		return true
	case n != 1:
		o.err = lostClaim(o.claim)
	}
	return false
}

// batchSettings are the transaction-local settings of a batch on
// PostgreSQL:
//
//   - lock_timeout 200ms: a batch holds a slot other calls queue for, so
//     none of its calls may wait long for a row lock (a record held by a
//     long transaction, such as a handler's open inbox transaction on the
//     same key). The batch then fails, and each of its calls runs on its
//     own, where it waits as an unbatched call does.
//   - enable_seqscan off: every statement of a batch looks records up by
//     primary key. From its sixth run on a connection, PostgreSQL reuses
//     a prepared statement's generic plan, planned for the table's size
//     at that moment; on a table analyzed while nearly empty, and not
//     analyzed since (autovacuum off), that plan is a sequential scan,
//     paid for by every later run on the grown table. Planned with
//     sequential scans off it is the index scan whatever the size; the
//     batch statements carry a tag (batchTag) of their own so that their
//     cached plans are always ones made inside a batch.
const batchSettings = "SELECT set_config('lock_timeout', '200ms', true), set_config('enable_seqscan', 'off', true)"

// batchTag marks the statements a PostgreSQL batch runs (see
// batchSettings).
const batchTag = " /* sqlstore batch */"

// pgxConn is implemented by the driver connections of
// github.com/jackc/pgx/v5/stdlib.
type pgxConn interface{ Conn() *pgx.Conn }

// errNotPgx reports a PostgreSQL driver other than pgx.
var errNotPgx = errors.New("sqlstore: not a pgx connection")

// batchPostgres runs a batch on PostgreSQL. With pgx it sends each call's
// own single-row statement (INSERT ... ON CONFLICT DO NOTHING for a claim,
// the fenced UPDATE or DELETE ... WHERE token = $n AND id = $m otherwise)
// in one pipeline: one network write, one implicit transaction, one
// commit, and a row count per call. The statements are the ones a lone
// call runs, prepared once per connection, each a primary-key lookup
// planned with sequential scans off (batchSettings). A multi-row
// statement (INSERT ... SELECT FROM unnest(...), UPDATE ... FROM
// unnest(...)) would save little server time over the pipeline, and its
// join plans, cached for the table's size when first planned, go wrong
// as a fresh table grows. With another driver it runs them in a
// transaction (one commit, a round trip each).
func (s *Store) batchPostgres(ctx context.Context, ops []*op) error {
	if s.notPgx.Load() {
		return s.batchTx(ctx, ops)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	now := s.now()
	var conflicts []*op
	err = conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConn)
		if !ok {
			return errNotPgx
		}
		c := pc.Conn()
		b := &pgx.Batch{}
		b.Queue(batchSettings)
		for _, o := range ops {
			stmt, args := s.opStatement(o, now)
			b.Queue(stmt+batchTag, args...)
		}
		br := c.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		for _, o := range ops {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return err
			}
			if applied(o, tag.RowsAffected()) {
				conflicts = append(conflicts, o)
			}
		}
		// Close reads the end of the implicit transaction: the commit.
		if err := br.Close(); err != nil {
			return err
		}
		s.resolveClaims(ctx, c, conflicts, now)
		return nil
	})
	_ = conn.Close()
	if errors.Is(err, errNotPgx) {
		s.notPgx.Store(true)
		return s.batchTx(ctx, ops)
	}
	return err
}

// resolveClaims decides, after the batch committed, the claims whose
// insert found a record: one read of those records (not locked), in a
// pipeline of its own on the batch's connection, then Duplicate or
// InProgress from a live record. An expired record (a takeover, which
// needs a lock), one gone since, or a failed read leaves the claim to its
// caller.
func (s *Store) resolveClaims(ctx context.Context, c *pgx.Conn, claims []*op, now time.Time) {
	if len(claims) == 0 {
		return
	}
	ids := make([]recordID, len(claims))
	for i, o := range claims {
		ids[i] = o.id()
	}
	b := &pgx.Batch{}
	b.Queue(batchSettings)
	b.Queue(s.q.selectRows(len(ids), false)+batchTag, s.idArgs([]any{s.q.timeArg(now)}, ids)...)
	br := c.SendBatch(ctx, b)
	_, err := br.Exec()
	var recs map[string]record
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			recs, err = scanRecords(rows)
			rows.Close()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	for _, o := range claims {
		r, ok := recs[s.q.idKey(o.id())]
		if err != nil || !ok || !decideClaim(o, r) {
			o.fallback = true
		}
	}
}

// batchTx runs a batch in one transaction of the calls' own single-row
// statements: one commit for the batch. On SQLite the statements cost no
// round trip (it runs in process) while each commit syncs the WAL to
// disk. A claim that finds a record reads it locked in the same
// transaction and takes an expired one over there.
func (s *Store) batchTx(ctx context.Context, ops []*op) error {
	now := s.now()
	q := s.q
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if s.cfg.Dialect == Postgres {
			if _, err := tx.ExecContext(ctx, batchSettings); err != nil {
				return err
			}
		}
		for _, o := range ops {
			stmt, args := s.opStatement(o, now)
			res, err := tx.ExecContext(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			if !applied(o, n) {
				continue
			}
			recs, err := s.fetch(ctx, tx, o.ks.ids, now, true)
			if err != nil {
				return err
			}
			r, ok := recs[q.idKey(o.id())]
			switch {
			case !ok:
				o.fallback = true // deleted since the INSERT found it
			case decideClaim(o, r):
			default:
				// Expired, and locked (SQLite: the transaction holds the
				// database's write lock).
				if _, err := tx.ExecContext(ctx, q.takeover(1), o.token, q.timeArg(now.Add(o.d)), q.idArg(o.id())); err != nil {
					return err
				}
				o.res.Result, o.res.Takeover = stores.Claimed, r.state == stateProcessing
			}
		}
		return nil
	})
}

// batchMySQL runs a batch in one transaction: one multi-row INSERT ... ON
// DUPLICATE KEY UPDATE for the claims, one SELECT ... FOR UPDATE
// of every record of the batch, then for the records still owned by their
// caller's token one UPDATE (Complete, Extend) or DELETE (Release) per
// kind, and the takeovers of expired records, one UPDATE each. MySQL has
// no RETURNING: the locked read tells which claims inserted their row
// (the row carries their token) and which fenced calls still own theirs.
func (s *Store) batchMySQL(ctx context.Context, tx *sql.Tx, ops []*op) error {
	now := s.now()
	q := s.q
	ids := make([]recordID, len(ops))
	var claims []any
	nClaims := 0
	for i, o := range ops {
		ids[i] = o.id()
		if o.kind == opClaim {
			claims = append(claims, q.idArg(o.id()), o.token, q.timeArg(now.Add(o.d)))
			nClaims++
		}
	}
	if nClaims > 0 {
		if _, err := tx.ExecContext(ctx, q.insertProcessingRows(nClaims), claims...); err != nil {
			return err
		}
	}
	recs, err := s.fetch(ctx, tx, ids, now, true)
	if err != nil {
		return err
	}
	var fenced [numOpKinds][]*op
	for _, o := range ops {
		r, ok := recs[q.idKey(o.id())]
		if o.kind != opClaim {
			if !ok || r.state != stateProcessing || r.token != o.token {
				o.err = lostClaim(o.claim)
				continue
			}
			fenced[o.kind] = append(fenced[o.kind], o)
			continue
		}
		switch {
		case !ok:
			o.fallback = true // deleted since the INSERT found it
		case r.state == stateProcessing && r.token == o.token:
			o.res.Result = stores.Claimed
		case decideClaim(o, r):
		default:
			if _, err := tx.ExecContext(ctx, q.takeover(1), o.token, q.timeArg(now.Add(o.d)), q.idArg(o.id())); err != nil {
				return err
			}
			o.res.Result, o.res.Takeover = stores.Claimed, r.state == stateProcessing
		}
	}
	// The rows are locked and owned: the statements below match them all.
	for k, os := range fenced {
		if len(os) == 0 {
			continue
		}
		var args []any
		if opKind(k) != opRelease {
			for _, o := range os {
				args = append(args, q.idArg(o.id()), q.timeArg(now.Add(o.d)))
			}
		}
		if opKind(k) == opComplete {
			for _, o := range os {
				args = append(args, q.idArg(o.id()), dataArg(o.data))
			}
		}
		for _, o := range os {
			args = append(args, q.idArg(o.id()))
		}
		if _, err := tx.ExecContext(ctx, q.fencedRows(opKind(k), len(os)), args...); err != nil {
			return err
		}
	}
	return nil
}
