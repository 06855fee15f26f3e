package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The Store: New, CreateSchema (and the partitions it creates ahead),
// the lease-mode calls (Claim, Complete, Release, Extend) and what they
// run on their own or hand to the group commit (the group's runner),
// Capabilities, Close, the session check, the retries, and the way to
// the error classifier. inbox.go (the transactional inbox), purge.go and
// admin.go hold the Store's other calls.

var (
	_ stores.Store = (*Store)(nil)
	_ stores.Inbox = (*Store)(nil)
)

// Store is the SQL store. Create it with New. It is safe for concurrent
// use, and any number of processes may share its table.
type Store struct {
	db  *sql.DB
	cfg Config
	// d is the dialect; q its statements and qk its quirks. part is the
	// partitioned layout's dialect, nil on the plain layout.
	d    dialect
	q    *statements
	qk   quirks
	part partitioner

	closed    atomic.Bool
	closeOnce sync.Once
	cancel    context.CancelFunc // stops the purge job
	done      chan struct{}

	// group coalesces concurrent single-key lease-mode calls (nil when
	// batching is off).
	group *group

	savepoints atomic.Uint64
	// maxLease is the longest lease given (ns): the purge keeps expired
	// claims at least that long.
	maxLease atomic.Int64

	// The session check (checkSession): done once it passed; refused
	// once it failed for good.
	sessionMu      sync.Mutex
	sessionChecked atomic.Bool
	sessionErr     error
	// serverMaxData is the most data the server takes in a statement,
	// when the session check found it below Config.MaxData; 0 otherwise.
	serverMaxData atomic.Int64

	// onPurgeBatch, when set (by tests), sees the size of every batch.
	onPurgeBatch func(n int64)
	// purgeChunk is the number of heap blocks a PostgreSQL purge
	// statement reads (purgeChunkBlocks; tests make it small).
	purgeChunk int64
}

// New returns a Store over db, which it uses but never closes. It does no
// I/O: create the table with CreateSchema or the DDL in README.md. When
// cfg.PurgeInterval is positive it starts the purge job; Close stops it.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: db is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Dialect == "" {
		d, err := DetectDialect(db)
		if err != nil {
			return nil, err
		}
		cfg.Dialect = d
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
	}
	cfg.setDefaults()
	d := dialects[cfg.Dialect].open(cfg.Table, cfg.DailyPartitions, db)
	s := &Store{
		db:   db,
		cfg:  cfg,
		d:    d,
		q:    d.sql(),
		qk:   d.quirks(),
		done: make(chan struct{}),

		purgeChunk: purgeChunkBlocks,
	}
	if cfg.DailyPartitions {
		s.part = d.(partitioner) // Validate admits DailyPartitions only for such a dialect
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if !cfg.Batch.Disabled && s.part == nil {
		s.group = newGroup(s, batch.Config(cfg.Batch))
	}
	if cfg.PurgeInterval > 0 {
		go s.purgeLoop(ctx)
	} else {
		close(s.done)
	}
	return s, nil
}

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.cfg.Dialect }

// Table returns the store's table name.
func (s *Store) Table() string { return s.cfg.Table }

// SchemaStatements returns the DDL that CreateSchema runs, one statement
// per element, for DBAs who apply it themselves.
func (s *Store) SchemaStatements() []string { return s.d.schema() }

// CreateSchema creates the table and its index if they do not exist (and,
// with DailyPartitions, the partitions from yesterday to
// PartitionDaysAhead+1 days ahead). It is idempotent and safe to run at
// every start; it needs CREATE privileges, which the store does not need
// otherwise.
func (s *Store) CreateSchema(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("sqlstore: create schema: %w", stores.ErrClosed)
	}
	for _, stmt := range s.d.schema() {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sqlstore: creating schema for table %s: %w", s.cfg.Table, err)
		}
	}
	if s.part != nil {
		if err := s.createPartitions(ctx); err != nil {
			return fmt.Errorf("sqlstore: creating partitions of table %s: %w", s.cfg.Table, err)
		}
	}
	return nil
}

// grace is how long after its lease ended the purge keeps a processing
// record: PurgeGrace, or the longest lease this store has given if
// longer.
func (s *Store) grace() time.Duration {
	return max(s.cfg.PurgeGrace, time.Duration(s.maxLease.Load()))
}

// noteLease raises maxLease to lease.
func (s *Store) noteLease(lease time.Duration) {
	for {
		m := s.maxLease.Load()
		if int64(lease) <= m || s.maxLease.CompareAndSwap(m, int64(lease)) {
			return
		}
	}
}

// createPartitions creates the partitions from yesterday to
// PartitionDaysAhead+1 days ahead (UTC days) that do not exist yet, but
// yesterday's once its day ended more than the purge's grace ago: the
// purge would drop it again at once, and each hourly run would lock the
// table twice for it.
func (s *Store) createPartitions(ctx context.Context) error {
	now := s.now()
	return s.part.createPartitions(ctx, s.db, now.UTC().Truncate(24*time.Hour), s.cfg.PartitionDaysAhead, now.Add(-s.grace()))
}

// Claim implements [stores.Store].
//
// A single key takes one INSERT ... ON CONFLICT DO NOTHING (INSERT ... ON
// DUPLICATE KEY UPDATE on MySQL) in the common case, and a SELECT
// more for a duplicate; concurrent single-key claims share those
// statements' round trip and commit with each other and with concurrent
// Completes, Releases and Extends (see [BatchConfig]). Taking over an expired record, and every multi-key
// claim, run in a short transaction: insert the missing records, lock the
// existing ones (SELECT ... FOR UPDATE), decide, update the expired ones,
// commit, or roll back when any key is live, so the claim is
// all-or-nothing.
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	return s.ClaimOwned(ctx, scope, keys, lease, nil)
}

// ClaimOwned implements [stores.OwnerClaimer]: a processing record keeps
// owner in its data column, which only done records use otherwise. A
// claim with an owner runs on its own statements, never in a batch.
func (s *Store) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	if err := s.checkCall(ctx, storekit.CheckKeys(keys), s.bounds().CheckLease(lease), stores.CheckOwner(owner)); err != nil {
		return nil, fmt.Errorf("sqlstore: claim: %w", err)
	}
	s.noteLease(lease)
	ks := newKeySet(scope, keys)
	token := newToken()
	c := &stores.Claim{Scope: scope, Keys: keys}
	var (
		o   *op
		err error
	)
	if len(owner) == 0 {
		o = s.group.op(ctx, opClaim, ks)
	}
	if o != nil {
		o.token, o.d = token, lease
		if err = s.group.do(ctx, o); err == nil {
			// Only now is o.res the caller's: a batch that went on
			// without a caller that gave up writes it still.
			c.Result, c.Takeover, c.Data, c.Owner = o.res.Result, o.res.Takeover, o.res.Data, o.res.Owner
		}
	} else {
		err = s.claimDirect(ctx, ks, token, lease, owner, c)
	}
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim in scope %q: %w", scope, s.classify(ctx, err))
	}
	if c.Result == stores.Claimed {
		c.Token = strconv.FormatInt(token, 36)
	}
	return c, nil
}

// claimArgs checks a call on claim c (Complete, Release, Extend), whose
// other arguments' checks are args, and returns c's keys and token.
func (s *Store) claimArgs(ctx context.Context, c *stores.Claim, args ...error) (keySet, int64, error) {
	var token int64
	err := storekit.CheckClaim(c)
	if err == nil {
		if token, err = strconv.ParseInt(c.Token, 36, 64); err != nil || token <= 0 {
			err = fmt.Errorf("%w: token %q is not a sqlstore token", stores.ErrInvalidArgument, c.Token)
		}
	}
	if err := s.checkCall(ctx, append([]error{err}, args...)...); err != nil {
		return keySet{}, 0, err
	}
	return newKeySet(c.Scope, c.Keys), token, nil
}

// opError prefixes the error of a Complete, Release or Extend.
func (s *Store) opError(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sqlstore: %s: %w", op, s.classify(ctx, err))
}

// Complete implements [stores.Store].
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	ks, token, err := s.claimArgs(ctx, c, s.bounds().CheckRetention(retention), s.Capabilities().CheckData(data))
	if err == nil {
		err = s.checkData(data) // after the session check
	}
	if err != nil {
		return s.opError(ctx, "complete", err)
	}
	if o := s.group.op(ctx, opComplete, ks); o != nil {
		o.claim, o.token, o.d, o.data = c, token, retention, data
		return s.opError(ctx, "complete", s.group.do(ctx, o))
	}
	return s.opError(ctx, "complete", s.completeDirect(ctx, c, ks, token, retention, data))
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	ks, token, err := s.claimArgs(ctx, c)
	if err != nil {
		return s.opError(ctx, "release", err)
	}
	if o := s.group.op(ctx, opRelease, ks); o != nil {
		o.claim, o.token = c, token
		return s.opError(ctx, "release", s.group.do(ctx, o))
	}
	return s.opError(ctx, "release", s.releaseDirect(ctx, c, ks, token))
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	ks, token, err := s.claimArgs(ctx, c, s.bounds().CheckLease(lease))
	if err != nil {
		return s.opError(ctx, "extend", err)
	}
	s.noteLease(lease)
	if o := s.group.op(ctx, opExtend, ks); o != nil {
		o.claim, o.token, o.d = c, token, lease
		return s.opError(ctx, "extend", s.group.do(ctx, o))
	}
	return s.opError(ctx, "extend", s.extendDirect(ctx, c, ks, token, lease))
}

// Capabilities implements [stores.Store]: data up to Config.MaxData; on
// the partitioned layout, leases and retentions of at
// most PartitionDaysAhead days; the Inbox (joining a caller's
// transaction), Admin and OwnerClaimer interfaces.
func (s *Store) Capabilities() stores.Capabilities {
	c := s.bounds()
	c.Kind = "sqlstore (" + string(s.cfg.Dialect) + ")"
	c.MaxData, c.Admin, c.Inbox, c.JoinedTx, c.Owners = s.cfg.MaxData, true, true, true, true
	if s.part != nil {
		c.Kind = "sqlstore (" + string(s.cfg.Dialect) + ", DailyPartitions)"
	}
	return c
}

// bounds are the store's bounds on leases and retentions, checked on
// every call (Capabilities' MaxLease and MaxRetention): with
// DailyPartitions, the partitions created ahead, PartitionDaysAhead days,
// so that expires_at never lands past them; none otherwise.
func (s *Store) bounds() stores.Capabilities {
	var c stores.Capabilities
	if s.part != nil {
		c.MaxLease = time.Duration(s.cfg.PartitionDaysAhead) * 24 * time.Hour
		c.MaxRetention = c.MaxLease
		c.BoundsSetting = "sqlstore.Config.PartitionDaysAhead"
	}
	return c
}

// Close stops the purge job and waits for it, and for the releases of
// claims made for callers that gave up while their batch ran (each bounded
// by 10s). The *sql.DB is not closed.
// Every later call returns [stores.ErrClosed]; transactions already begun
// can still be committed or rolled back. It is idempotent. A MySQL COMMIT
// or ROLLBACK abandoned at its context's deadline (go-sql-driver cannot
// cancel one) goes on in the background until its connection answers or
// dies; Close does not wait for it.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
	})
	select {
	case <-s.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.group != nil {
		// Releases of claims whose callers gave up (see group.orphaned).
		return s.group.b.Close(ctx)
	}
	return nil
}

// direct runs o on its own statements under its caller's context, as an
// unbatched store does.
func (s *Store) direct(o *op) error {
	switch o.kind {
	case opClaim:
		o.res = stores.Claim{}
		return s.claimDirect(o.ctx, o.ks, o.token, o.d, nil, &o.res)
	case opComplete:
		return s.completeDirect(o.ctx, o.claim, o.ks, o.token, o.d, o.data)
	case opRelease:
		return s.releaseDirect(o.ctx, o.claim, o.ks, o.token)
	default:
		return s.extendDirect(o.ctx, o.claim, o.ks, o.token, o.d)
	}
}

// execBatch runs a batch of several ops on the dialect's executor, for
// the group.
func (s *Store) execBatch(ctx context.Context, ops []*op) error {
	return s.d.execBatch(ctx, s.db, ops, s.now())
}

// errs is the classifier of the store's errors.
func (s *Store) errs() classifier { return classifier{db: s.db, d: s.d} }

// classify puts err, from a call made under ctx, in its class of the
// stores contract (see classifier.classify).
func (s *Store) classify(ctx context.Context, err error) error { return s.errs().classify(ctx, err) }

// is reports whether err belongs to class c (see classifier.is).
func (s *Store) is(err error, c errClass) bool { return s.errs().is(err, c) }

// connLost reports a connection that broke under the client (see
// classifier.connLost).
func (s *Store) connLost(err error) bool { return s.errs().connLost(err) }

// maxAttempts bounds the retries of an operation that hit a transient
// conflict (deadlock, serialization failure, busy SQLite).
const maxAttempts = 10

// checkCall is [storekit.CheckCall], then the session check: every
// failure a call meets before its own statements.
func (s *Store) checkCall(ctx context.Context, args ...error) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), args...); err != nil {
		return err
	}
	return s.checkSession(ctx)
}

// checkSession makes sure, once, that the database session settings suit
// the store (see ErrSessionSettings), as the dialect checks them. A check
// that fails for another reason (the database is down) runs again at the
// next call.
func (s *Store) checkSession(ctx context.Context) error {
	if s.sessionChecked.Load() {
		return s.sessionErr // written before sessionChecked
	}
	s.sessionMu.Lock()
	defer s.sessionMu.Unlock()
	if s.sessionChecked.Load() {
		return s.sessionErr
	}
	limit, err := s.d.checkSession(ctx, s.db)
	if err != nil {
		if !errors.Is(err, ErrSessionSettings) {
			return s.classify(ctx, err) // not known yet: checked again next time
		}
		s.sessionErr = err
	}
	if limit > 0 && limit < s.cfg.MaxData {
		s.serverMaxData.Store(int64(limit))
		s.cfg.Logger.Error("sqlstore: the database refuses statements carrying Config.MaxData bytes of data; lower MaxData or raise the server's limit (MySQL: max_allowed_packet)",
			fmt.Errorf("%w: data over %d bytes is refused (MaxData is %d)", stores.ErrTooLarge, limit, s.cfg.MaxData), watermill.LogFields{"table": s.cfg.Table})
	}
	s.sessionChecked.Store(true)
	return s.sessionErr
}

// checkData refuses data over MaxData, or over what the server takes
// (see serverMaxData). The session check must have run.
func (s *Store) checkData(data []byte) error {
	return storekit.CheckData(s.Capabilities(), data, s.serverMaxData.Load(), "its max_allowed_packet is below Config.MaxData")
}

// now is the clock's time at the database's (microsecond) precision.
func (s *Store) now() time.Time { return s.cfg.Clock.Now().Truncate(time.Microsecond) }

// inWriteTx runs fn in a short transaction of the store's own whose first
// statement writes (an INSERT, a DELETE): that statement takes the
// database's write lock, so no lockFirst is needed. A transaction that
// may read first uses inTx.
func (s *Store) inWriteTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return inTx(ctx, s.db, s.qk.txOptions, fn)
}

// inTx runs fn in a short transaction of the store's own, which begins
// with the dialect's lockFirst when it has one: fn may read before it
// writes.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return inTx(ctx, s.db, s.qk.txOptions, func(tx *sql.Tx) error {
		if s.qk.lockFirst != "" {
			if _, err := tx.ExecContext(ctx, s.qk.lockFirst); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// retry runs op until it succeeds, fails with a non-transient error, or
// maxAttempts is reached, with jittered exponential backoff.
func (s *Store) retry(ctx context.Context, op func() error) error {
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || !s.is(err, errRetryable) || attempt == maxAttempts {
			return err
		}
		d := time.Duration(1<<min(attempt, 6)) * time.Millisecond
		d = d/2 + mrand.N(d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

// orderKeys returns the idKeys of ks's ids in the caller's order.
func (s *Store) orderKeys(ks keySet) []string {
	keys := make([]string, len(ks.order))
	for i, id := range ks.order {
		keys[i] = idKey(s.d, id)
	}
	return keys
}

// acquire makes sure every key of ks has a record in tx: it inserts the
// missing ones with insert (arguments from args) and returns the ids that
// already had one, with their records, locked. It takes the ids' locks in
// their sorted order, one id after the other, so concurrent multi-key
// claims and Begins never wait on each other in a cycle.
//
// On the plain layout each id is an INSERT ... ON CONFLICT DO NOTHING
// (which waits for a concurrent uncommitted insert of the same id), and,
// when the id has a record, a locking read of it. A record that its owner
// deletes between the two (a Release, a purge) is gone when the read
// gets its lock: the id is inserted again, up to maxAttempts times, where
// giving up would have made the whole transaction start again behind
// every lock it held. On the partitioned layout the ids' locks come
// first, then a locking read across partitions, then the inserts.
func (s *Store) acquire(ctx context.Context, tx *sql.Tx, ks keySet, now time.Time, insert string, args func(id recordID) []any) ([]recordID, map[string]record, error) {
	var rest []recordID
	if s.part != nil {
		if err := s.part.lockIDs(ctx, tx, ks.ids); err != nil {
			return nil, nil, err
		}
		recs, err := fetch(ctx, tx, s.d, ks.ids, now, true)
		if err != nil {
			return nil, nil, err
		}
		for _, id := range ks.ids {
			if _, ok := recs[idKey(s.d, id)]; ok {
				rest = append(rest, id)
			} else if _, err := tx.ExecContext(ctx, insert, args(id)...); err != nil {
				return nil, nil, err
			}
		}
		return rest, recs, nil
	}
	var recs map[string]record
	for _, id := range ks.ids {
		for attempt := 1; ; attempt++ {
			res, err := tx.ExecContext(ctx, insert, args(id)...)
			if err != nil {
				return nil, nil, err
			}
			if ins, err := s.d.inserted(res); err != nil {
				return nil, nil, err
			} else if ins {
				break
			}
			one, err := fetch(ctx, tx, s.d, []recordID{id}, now, true)
			if err != nil {
				return nil, nil, err
			}
			if r, ok := one[idKey(s.d, id)]; ok {
				if recs == nil {
					recs = make(map[string]record, len(ks.ids))
				}
				recs[idKey(s.d, id)] = r
				rest = append(rest, id)
				break
			}
			if attempt == maxAttempts {
				return nil, nil, errRetry // deleted under us every time
			}
		}
	}
	return rest, recs, nil
}

// claimDirect claims ks on its own statements, retrying transient
// conflicts; owner, when set, is kept with the processing records.
func (s *Store) claimDirect(ctx context.Context, ks keySet, token int64, lease time.Duration, owner []byte, c *stores.Claim) error {
	return s.retry(ctx, func() error { return s.claimOnce(ctx, ks, token, lease, owner, c) })
}

func (s *Store) claimOnce(ctx context.Context, ks keySet, token int64, lease time.Duration, owner []byte, c *stores.Claim) error {
	now := s.now()
	exp := s.d.timeArg(now.Add(lease))
	own := dataArg(owner)
	c.Result, c.Takeover, c.Data, c.Owner = 0, false, nil, nil
	if len(ks.ids) == 1 && s.part == nil {
		res, err := s.db.ExecContext(ctx, s.q.insertProcessing, s.d.idArg(ks.ids[0]), token, exp, own)
		if err != nil {
			return err
		}
		if ins, err := s.d.inserted(res); err != nil {
			return err
		} else if ins {
			c.Result = stores.Claimed
			return nil
		}
		recs, err := fetch(ctx, s.db, s.d, ks.ids, now, false)
		if err != nil {
			return err
		}
		if len(recs) == 1 {
			// Claimed when the record is ours: an earlier attempt (or a
			// batch whose outcome was unknown) inserted it.
			if c.Result, c.Data, c.Owner, _ = decide(recs, s.orderKeys(ks), token); c.Result != 0 {
				return nil
			}
		}
		// Expired (or gone since the INSERT): take over under a lock.
	}
	// acquire's first statement is an INSERT, or (partitions, never on
	// SQLite) its lock of the partitions.
	return s.inWriteTx(ctx, func(tx *sql.Tx) error {
		rest, recs, err := s.acquire(ctx, tx, ks, now, s.q.insertProcessing, func(id recordID) []any {
			return []any{s.d.idArg(id), token, exp, own}
		})
		if err != nil {
			return err
		}
		c.Result, c.Data, c.Owner, c.Takeover = decide(recs, s.orderKeys(ks), token)
		switch c.Result {
		case stores.Claimed:
			return nil
		case stores.Duplicate, stores.InProgress:
			return errRollback // undo the records we inserted
		}
		if _, err := tx.ExecContext(ctx, s.q.takeover(len(rest)), idArgs(s.d, []any{token, exp, own}, rest)...); err != nil {
			return err
		}
		c.Result = stores.Claimed
		return nil
	})
}

// fenced runs a token-checked statement over every record of a claim. One
// key is one autocommit statement; several keys lock and count their
// records first, in a transaction, so a partly lost claim changes nothing.
// mayBeNoop marks a statement that can leave a row unchanged (Extend to
// the same instant), which some dialects report as 0 rows affected.
func (s *Store) fenced(ctx context.Context, c *stores.Claim, ks keySet, token int64, stmt string, set []any, mayBeNoop bool) error {
	args := idArgs(s.d, append(set, token), ks.ids)
	lost := lostClaim(c)
	return s.retry(ctx, func() error {
		if len(ks.ids) == 1 {
			res, err := s.db.ExecContext(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			if n == 0 && mayBeNoop && s.qk.noopUpdateMatchesNothing {
				n, err = s.countOwned(ctx, s.db, ks, token, false)
				if err != nil {
					return err
				}
			}
			if n != 1 {
				return lost
			}
			return nil
		}
		return s.inTx(ctx, func(tx *sql.Tx) error {
			n, err := s.countOwned(ctx, tx, ks, token, true)
			if err != nil {
				return err
			}
			if n != int64(len(ks.ids)) {
				return lost
			}
			_, err = tx.ExecContext(ctx, stmt, args...)
			return err
		})
	})
}

func (s *Store) countOwned(ctx context.Context, db querier, ks keySet, token int64, lock bool) (int64, error) {
	rows, err := db.QueryContext(ctx, s.q.owned(len(ks.ids), lock), idArgs(s.d, []any{token}, ks.ids)...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

func (s *Store) completeDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64, retention time.Duration, data []byte) error {
	exp := s.d.timeArg(s.now().Add(retention))
	return s.fenced(ctx, c, ks, token, s.q.complete(len(ks.ids)), []any{exp, dataArg(data)}, false)
}

func (s *Store) releaseDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64) error {
	return s.fenced(ctx, c, ks, token, s.q.release(len(ks.ids)), nil, false)
}

func (s *Store) extendDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64, lease time.Duration) error {
	exp := s.d.timeArg(s.now().Add(lease))
	return s.fenced(ctx, c, ks, token, s.q.extend(len(ks.ids)), []any{exp}, true)
}
