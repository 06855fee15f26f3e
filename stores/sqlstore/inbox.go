package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore/internal/wsqlguard"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

type txKey struct{}

// TxFromContext returns the transaction of the inbox record, for the
// handler to write its business rows in: they commit or roll back with the
// record. It is set on the context given by [stores.InboxTx.Context] (the
// middleware hands it to the handler as the message's context), or by
// [WithTx].
//
// A handler must return the error of a statement that fails in this
// transaction, never retry the statement in it: on a deadlock (and on a
// lock wait timeout under innodb_rollback_on_timeout) MySQL rolls the whole
// transaction back, record included, and runs the statements that follow
// in autocommit, outside any transaction. Their effects would commit
// without the record, and the redelivery would apply them again. Returning
// the error rolls back, and the redelivery runs in a new transaction.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// WithTx returns ctx carrying tx, for Begin to join: Begin then works inside
// tx with a SAVEPOINT instead of opening a transaction, and the caller
// commits tx. tx must be on the database that holds the table.
func WithTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// outerTx is the transaction Begin must join, if any: one given with
// WithTx (or by an enclosing inbox transaction), else the one
// Config.JoinTx finds (a watermill-sql subscriber's). An error is
// Config.JoinTx's refusal (ErrTxNotJoinable).
func (s *Store) outerTx(ctx context.Context) (*sql.Tx, bool, error) {
	if tx, ok := TxFromContext(ctx); ok {
		return tx, true, nil
	}
	return s.findTx(ctx)
}

// findTx is Config.JoinTx's transaction in ctx, if any.
func (s *Store) findTx(ctx context.Context) (*sql.Tx, bool, error) {
	if s.cfg.JoinTx == nil {
		return nil, false, nil
	}
	tx, err := s.cfg.JoinTx(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrTxNotJoinable, err)
	}
	return tx, tx != nil, nil
}

// JoinedTx implements [stores.TxJoiner]: it returns the *sql.Tx that ctx
// carries for Begin to join (one given with [WithTx], or the one
// Config.JoinTx finds). A transaction Config.JoinTx finds but refuses is
// reported too (ok, as a value equal for the same refusal), since Begin
// would not open a transaction of its own there: it fails with
// ErrTxNotJoinable.
func (s *Store) JoinedTx(ctx context.Context) (any, bool) {
	tx, ok, err := s.outerTx(ctx)
	if err != nil {
		return refusedTx{err.Error()}, true
	}
	if !ok {
		return nil, false
	}
	return tx, true
}

// Begin implements [stores.Inbox].
//
// Without a transaction in ctx it opens one (READ COMMITTED; on SQLite the
// INSERT takes the database's write lock) that outlives ctx: it ends with
// Commit or Rollback, which the caller must call. It inserts a done record
// for every key (INSERT ... ON CONFLICT DO NOTHING): an uncommitted record
// of a concurrent Begin makes it wait for that transaction, so concurrent
// duplicates serialise on the primary key. Existing records are locked and
// read: a live done one makes the result Duplicate (everything is rolled
// back), an expired one is replaced, a live processing one (a lease-mode
// claim sharing the table) makes the result InProgress (rolled back too).
//
// When ctx carries a transaction (one given with WithTx, or the one
// Config.JoinTx finds: a watermill-sql subscriber's) Begin works inside
// it under a SAVEPOINT:
// Commit releases it, Rollback and a Duplicate roll back to it. Each
// attempt of a message gets its own savepoint, which matters with
// watermill-sql, whose subscriber redelivers a nacked message inside the
// same transaction without rolling it back: the failed attempt's writes
// are undone by the rollback to its savepoint.
//
// A joined transaction the database has already ended fails Begin with
// [stores.ErrTxAborted] before anything is written: on MySQL a deadlock
// rolls the whole transaction back on the server while the client's
// *sql.Tx stays open (its statements would then run in autocommit, and the
// record would commit although the handler failed), and PostgreSQL
// refuses the statements of a transaction an earlier error aborted. With
// a subscriber of wsql3.NewSubscriber or wsql4.NewSubscriber, the store
// has it roll that transaction back on the client at once (Begin, Commit
// and Rollback do, whichever finds it dead), before the message is
// nacked: nothing runs in it any more, the subscriber's offset ack
// included, and the batch is delivered again in a new transaction. On
// MySQL the check costs a joined Begin one more statement.
func (s *Store) Begin(ctx context.Context, scope string, keys []string, retention time.Duration) (stores.InboxTx, error) {
	if err := s.checkCall(ctx, storekit.CheckKeys(keys), s.bounds().CheckRetention(retention)); err != nil {
		return nil, fmt.Errorf("sqlstore: begin: %w", err)
	}
	ks := newKeySet(scope, keys)
	tx, ok, err := s.outerTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: begin in scope %q: %w", scope, err)
	}
	if ok {
		itx, err := s.beginSavepoint(ctx, tx, ks, retention)
		if err != nil {
			return nil, fmt.Errorf("sqlstore: begin in scope %q: %w", scope, s.classify(ctx, err))
		}
		return itx, nil
	}
	var itx *inboxTx
	err = s.retry(ctx, func() (err error) {
		if s.qk.lockWaitIgnoresContext != nil && s.qk.lockWaitIgnoresContext() {
			itx, err = s.watched(ctx, func() (*inboxTx, error) { return s.beginOwnOnce(ctx, ks, retention) })
		} else {
			itx, err = s.beginOwnOnce(ctx, ks, retention)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlstore: begin in scope %q: %w", scope, s.classify(ctx, err))
	}
	return itx, nil
}

// beginOwnOnce is one attempt of Begin in a transaction of the store's
// own.
func (s *Store) beginOwnOnce(ctx context.Context, ks keySet, retention time.Duration) (*inboxTx, error) {
	t, err := s.beginOwn(ctx)
	if err != nil {
		return nil, err
	}
	exp := s.now().Add(retention)
	res, data, err := s.insertDone(ctx, t.tx, ks, exp)
	if err == nil && !t.detach() {
		err = ctx.Err() // ctx ended: the transaction is being rolled back
	}
	if err != nil || res != stores.Claimed {
		t.rollback()
		if err != nil {
			return nil, withCtxErr(ctx, err)
		}
		return &inboxTx{result: res, data: data}, nil
	}
	return &inboxTx{s: s, tx: t.tx, own: t, ks: ks, exp: exp, result: stores.Claimed}, nil
}

// watched runs begin (an attempt of Begin) in a goroutine and returns
// when it does or when ctx ends, whichever comes first: for a driver
// whose statements wait for SQLite's write lock (its busy_timeout)
// without watching their context (mattn/go-sqlite3). A transaction begin
// gets after ctx ended is rolled back in that goroutine.
func (s *Store) watched(ctx context.Context, begin func() (*inboxTx, error)) (*inboxTx, error) {
	return bounded(ctx, begin, func(itx *inboxTx, err error) {
		if err == nil && itx.own != nil {
			itx.own.rollback()
		}
	})
}

// bounded runs fn in a goroutine of its own and returns its result, or
// ctx's error when ctx ends first: for a database call the driver does not
// bound by a context. A result that comes after that is handed to late.
// The goroutine is not the store's to stop: an abandoned call ends when
// the driver gives up, at the latest when its connection dies, and Close
// does not wait for it.
func bounded[T any](ctx context.Context, fn func() (T, error), late func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var (
		mu        sync.Mutex
		abandoned bool
		ch        = make(chan result, 1)
	)
	go func() {
		v, err := fn()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			late(v, err)
			return
		}
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-ch:
		return r.v, r.err
	default:
		abandoned = true
		var zero T
		return zero, ctx.Err()
	}
}

// ownTx is a transaction of the store's own for one inbox message. It
// outlives the context of the Begin that opened it (the middleware's
// per-call timeout ends as soon as Begin returns), while each step —
// Begin, Commit, Rollback — is bounded by the context of its own call.
type ownTx struct {
	s  *Store
	tx *sql.Tx
	// cancel ends the transaction's context: database/sql then rolls the
	// transaction back, and pgx gives up a commit in flight.
	cancel context.CancelFunc
	// stop detaches the transaction from the Begin's context.
	stop func() bool
}

// beginOwn opens a transaction that ctx bounds until detach is called.
func (s *Store) beginOwn(ctx context.Context) (*ownTx, error) {
	life, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := s.db.BeginTx(life, s.qk.txOptions)
	if err != nil {
		stop()
		cancel()
		return nil, withCtxErr(ctx, err)
	}
	return &ownTx{s: s, tx: tx, cancel: cancel, stop: stop}, nil
}

// detach makes the transaction outlive the Begin's context. It reports
// false when that context ended first (the transaction is rolled back).
func (t *ownTx) detach() bool { return t.stop() }

// rollback rolls the transaction back, without waiting for the database
// longer than the store's own short bound.
func (t *ownTx) rollback() {
	ctx, cancel := context.WithTimeout(context.Background(), ownRollbackTimeout)
	defer cancel()
	_ = t.end(ctx, false)
}

// ownRollbackTimeout bounds a rollback the store does on its own (a
// Begin that found a duplicate or failed).
const ownRollbackTimeout = 5 * time.Second

// end commits or rolls the transaction back, returning when the database
// answers or ctx ends, whichever comes first; then the outcome is unknown
// (the error wraps ctx's). database/sql's Commit and Rollback take no
// context: pgx bounds them by the transaction's context, which end
// cancels when ctx ends; a driver that ignores it (go-sql-driver/mysql:
// nothing but its DSN's readTimeout bounds them; quirks.endIgnoresContext)
// has the call run in a goroutine of its own (see bounded).
func (t *ownTx) end(ctx context.Context, commit bool) error {
	do := t.tx.Rollback
	if commit {
		do = t.tx.Commit
	}
	defer t.cancel()
	if !t.s.qk.endIgnoresContext {
		stop := context.AfterFunc(ctx, t.cancel)
		err := do()
		stop()
		return withCtxErr(ctx, err)
	}
	_, err := bounded(ctx, func() (struct{}, error) { return struct{}{}, do() }, func(struct{}, error) {})
	if err != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("no answer from the database (outcome unknown): %w", err)
	}
	return err
}

// withCtxErr makes err wrap ctx's error too once ctx has ended, so that a
// call cut short by its caller's deadline reports
// context.DeadlineExceeded even when the driver saw only a cancellation.
func withCtxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

// maxSavepointAttempts bounds the retries inside an outer transaction,
// which can only retry what errRetry reports: a deadlock or serialization
// failure leaves the outer transaction unusable (MySQL rolls all of it
// back), so it is returned for the caller to nack.
const maxSavepointAttempts = 3

func (s *Store) beginSavepoint(ctx context.Context, tx *sql.Tx, ks keySet, retention time.Duration) (*inboxTx, error) {
	sp := fmt.Sprintf("sqlstore_%d", s.savepoints.Add(1))
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
		return nil, s.joinedError(ctx, err)
	}
	if err := s.d.joinCheck(ctx, tx, sp); err != nil {
		return nil, s.joinedError(ctx, err)
	}
	for attempt := 1; ; attempt++ {
		exp := s.now().Add(retention)
		res, data, err := s.insertDone(ctx, tx, ks, exp)
		if err == nil && res == stores.Claimed {
			return &inboxTx{s: s, tx: tx, ks: ks, exp: exp, savepoint: sp, result: stores.Claimed}, nil
		}
		if s.is(err, errTxDead) {
			// Nothing to roll back to: the server ended the transaction.
			return nil, s.joinedError(ctx, err)
		}
		if rerr := rollbackTo(ctx, tx, sp, err == nil || (errors.Is(err, errRetry) && attempt < maxSavepointAttempts)); rerr != nil {
			return nil, errors.Join(err, s.joinedError(ctx, rerr))
		}
		if err == nil {
			return &inboxTx{result: res, data: data}, nil
		}
		if !errors.Is(err, errRetry) || attempt == maxSavepointAttempts {
			return nil, err
		}
	}
}

// rollbackTo undoes everything since savepoint sp, and releases it unless
// keep (to try again under it).
func rollbackTo(ctx context.Context, tx *sql.Tx, sp string, keep bool) error {
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
		return fmt.Errorf("rolling back to savepoint %s: %w", sp, err)
	}
	if keep {
		return nil
	}
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), "RELEASE SAVEPOINT "+sp); err != nil {
		return fmt.Errorf("releasing savepoint %s: %w", sp, err)
	}
	return nil
}

// insertDone inserts done records for ks in tx, expiring at expires, and
// reports Claimed, Duplicate (with its data) or InProgress; the caller
// rolls back unless Claimed.
func (s *Store) insertDone(ctx context.Context, tx *sql.Tx, ks keySet, expires time.Time) (stores.Result, []byte, error) {
	now := s.now()
	exp := s.d.timeArg(expires)
	rest, recs, err := s.acquire(ctx, tx, ks, now, s.q.insertDone, func(id recordID) []any {
		return []any{s.d.idArg(id), exp}
	})
	if err != nil {
		return 0, nil, err
	}
	if res, data, _, _ := decide(recs, s.orderKeys(ks), 0); res != 0 {
		return res, data, nil
	}
	if _, err := tx.ExecContext(ctx, s.q.replaceDone(len(rest)), idArgs(s.d, []any{exp}, rest)...); err != nil {
		return 0, nil, err
	}
	return stores.Claimed, nil, nil
}

// inboxTx is one message's inbox transaction.
type inboxTx struct {
	s         *Store
	tx        *sql.Tx
	own       *ownTx // the store's own transaction; nil when joined
	ks        keySet
	exp       time.Time // the records' expiry, as inserted
	savepoint string    // "" when the store owns tx
	result    stores.Result
	data      []byte

	mu       sync.Mutex
	finished bool
}

var _ stores.InboxTx = (*inboxTx)(nil)

// Result implements [stores.InboxTx].
func (t *inboxTx) Result() stores.Result { return t.result }

// Data implements [stores.InboxTx].
func (t *inboxTx) Data() []byte { return t.data }

// Context implements [stores.InboxTx]: the returned context carries the
// transaction for [TxFromContext]. A Duplicate has none: parent is
// returned.
func (t *inboxTx) Context(parent context.Context) context.Context {
	if t.result != stores.Claimed {
		return parent
	}
	return WithTx(parent, t.tx)
}

// Commit implements [stores.InboxTx]. It stores data on every record (one
// UPDATE, skipped when data is empty), then commits the transaction, or
// releases the savepoint (the outer transaction's owner commits it). A
// second Commit, or one after Rollback, fails with sql.ErrTxDone.
func (t *inboxTx) Commit(ctx context.Context, data []byte) error {
	if t.result != stores.Claimed {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return fmt.Errorf("sqlstore: commit: %w", sql.ErrTxDone)
	}
	if err := errors.Join(t.s.checkData(data), ctx.Err()); err != nil {
		// Nothing sent: the transaction is still open, for Rollback (or
		// a Commit without the data).
		return fmt.Errorf("sqlstore: commit: %w", err)
	}
	t.finished = true
	s, q := t.s, t.s.q
	if len(data) > 0 {
		// Only the records this transaction inserted match (their exact
		// expiry): in a transaction the server has rolled back (MySQL
		// then runs the statement in autocommit) there are none, and a
		// record another consumer committed meanwhile is left alone.
		res, err := t.tx.ExecContext(ctx, q.setData(len(t.ks.ids)), idArgs(s.d, []any{data, s.d.timeArg(t.exp)}, t.ks.ids)...)
		if err == nil {
			var n int64
			if n, err = res.RowsAffected(); err == nil && n != int64(len(t.ks.ids)) {
				err = fmt.Errorf("%w: %d of its %d records are gone", stores.ErrTxAborted, n, len(t.ks.ids))
			}
		}
		if err != nil {
			// Ended first: the classification may need a connection of
			// the pool, and this transaction's may be the only one.
			err = s.joinedError(ctx, err)
			aerr := t.abort(ctx)
			return errors.Join(fmt.Errorf("sqlstore: commit: storing data: %w", s.classify(ctx, err)), aerr)
		}
	}
	if t.own == nil {
		if _, err := t.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+t.savepoint); err != nil {
			err = s.joinedError(ctx, err)
			aerr := t.abort(ctx)
			return errors.Join(fmt.Errorf("sqlstore: commit: releasing savepoint: %w", s.classify(ctx, err)), aerr)
		}
		return nil
	}
	if err := t.own.end(ctx, true); err != nil {
		// The outcome is unknown when the connection broke during COMMIT:
		// a redelivery finds the record (Duplicate) or not (runs again).
		return fmt.Errorf("sqlstore: commit: %w", s.classify(ctx, err))
	}
	return nil
}

// Rollback implements [stores.InboxTx]. It undoes the records and the
// handler's writes: it rolls the transaction back, or rolls back to the
// savepoint (leaving the outer transaction usable). It is a no-op after
// Commit or Rollback.
func (t *inboxTx) Rollback(ctx context.Context) error {
	if t.result != stores.Claimed {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return nil
	}
	t.finished = true
	if err := t.abort(ctx); err != nil {
		return fmt.Errorf("sqlstore: rollback: %w", t.s.classify(ctx, err))
	}
	return nil
}

func (t *inboxTx) abort(ctx context.Context) error {
	if t.own == nil {
		err := rollbackTo(ctx, t.tx, t.savepoint, false)
		if errors.Is(err, sql.ErrTxDone) {
			// The joined transaction is over (its guard rolled it back
			// when its connection broke): nothing of it is left to undo.
			return nil
		}
		return t.s.joinedError(ctx, err)
	}
	if err := t.own.end(ctx, false); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// joinedError marks err with stores.ErrTxAborted when it says that the
// transaction a joined Begin works in is over, and has the guard of the
// watermill-sql subscriber that delivered ctx's message roll that
// transaction back on the client too, before the delivery ends: on MySQL
// the subscriber's offset ack would otherwise run in autocommit, and
// commit the offsets of the messages whose effects the server rolled
// back. A transaction whose connection broke is over as well: rolled
// back so, it gives its connection back to the pool, which classify may
// need to tell an outage.
func (s *Store) joinedError(ctx context.Context, err error) error {
	dead := errors.Is(err, stores.ErrTxAborted)
	if !dead && s.is(err, errTxDead) {
		dead, err = true, fmt.Errorf("%w: %w", stores.ErrTxAborted, err)
	}
	if dead || (err != nil && s.connLost(err)) {
		wsqlguard.Abort(ctx)
	}
	return err
}
