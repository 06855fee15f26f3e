// Package sqlstore keeps dedup records in a SQL table, over database/sql,
// on PostgreSQL, MySQL/MariaDB or SQLite.
//
// It offers both modes of the middleware:
//
//   - lease mode ([stores.Store]): Claim inserts a processing record,
//     Complete turns it into a done record. Records survive restarts and are
//     shared by every process using the table.
//   - transactional inbox mode ([stores.Inbox]): Begin inserts a done record
//     inside a transaction that the handler's own writes join (through
//     [TxFromContext]); commit writes effect and record together, rollback
//     neither. Inside a watermill-sql subscriber's transaction it uses a
//     SAVEPOINT, so offset ack, dedup record and business write commit
//     together.
//
// # Schema
//
// One table, keyed by a 128-bit digest of (scope, key) ([RecordID]), with
// the fencing token (NULL once done), one expiry column (lease end while
// processing, retention end once done) and the opaque data; MySQL and
// SQLite also keep the state in a column of its own, PostgreSQL tells it
// from the token. The exact DDL per dialect is in README.md;
// [Store.CreateSchema] runs it. On PostgreSQL no index covers a column
// that Complete changes, so Complete is a HOT update (no new index entry),
// and the purge reads the heap in block ranges instead of an index; a
// done record without data takes about 92 bytes including its primary key
// written by Begin, 100 to 114 written by Claim + Complete, depending on
// how soon PostgreSQL can prune the processing row version (README.md).
//
// # Group commit
//
// Concurrent single-key lease-mode calls (Claim, Complete, Release,
// Extend) that arrive while a batch is running are coalesced into the
// next batch: one round trip and one commit for all of them, each call
// with its own result (see [BatchConfig]; on by default). A lone caller
// runs at once, on the statements an unbatched call runs.
//
// # Time
//
// Leases and expiry are computed in Go with Config.Clock and passed to the
// database as parameters; the database clock is never read. Consumers
// sharing a table must keep their clocks roughly in sync (NTP): a consumer
// whose clock runs ahead by d sees other consumers' leases expire d early,
// so clock skew eats into the lease.
//
// # Retention
//
// Expired records are never treated as live, whether or not they have been
// deleted. [Store.Purge] deletes them in bounded batches; set
// Config.PurgeInterval to run it in the background.
package sqlstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
)

// ErrInvalidTable is returned by Config.Validate and New for a table name
// that is not a plain identifier. No SQL is ever built from such a name.
var ErrInvalidTable = errors.New("sqlstore: invalid table name")

// ErrSessionSettings is returned by every call on a database whose session
// settings break an assumption of the store: MySQL's autocommit off
// (autocommit=0 in the DSN), under which the store's single statements
// open transactions nobody commits. Fix the DSN; the error names the
// setting. It is checked once, at the first call that reaches the
// database.
var ErrSessionSettings = errors.New("sqlstore: a database session setting breaks the store")

// Default values of Config fields.
const (
	DefaultTable      = "dedup_inbox"
	DefaultPurgeBatch = 1000
	DefaultPurgeGrace = 15 * time.Minute

	DefaultPartitionDaysAhead = 8

	// MaxPurgeBatch bounds Config.PurgeBatch.
	MaxPurgeBatch = 100_000
)

// maxAttempts bounds the retries of an operation that hit a transient
// conflict (deadlock, serialization failure, busy SQLite).
const maxAttempts = 10

// Config configures a Store. The zero value is ready to use with a
// database whose driver DetectDialect recognises.
type Config struct {
	// Dialect is the database's SQL flavour. The default is detected from
	// the *sql.DB's driver (see DetectDialect).
	Dialect Dialect

	// Table is the table name, "table" or "schema.table" (not on SQLite):
	// lowercase ASCII letters, digits and underscores, at most 48 bytes for
	// the table part. Anything else fails with ErrInvalidTable before any
	// SQL runs. The default is "dedup_inbox".
	Table string

	// Clock tells the time; nil means the system clock. Tests inject a fake.
	Clock stores.Clock

	// PurgeInterval is how often New's background job deletes expired
	// records. Zero (the default) starts no job: call Purge yourself (from
	// a cron job, say) or the table grows without bound. Several processes
	// may purge the same table at once.
	PurgeInterval time.Duration

	// PurgeBatch is the most records one purge statement deletes; Purge
	// runs statements until a batch comes back short. The default is 1000;
	// it must be at most MaxPurgeBatch.
	PurgeBatch int

	// PurgeGrace is how long a processing record whose lease ran out (an
	// abandoned claim) is kept before the purge deletes it, so a late
	// takeover is still reported as one (stores.Claim.Takeover) and a slow
	// owner can still complete. The purge keeps such a record at least as
	// long as the longest lease this store has given, too; set PurgeGrace
	// above your longest lease for the leases other processes give. Done records are deleted as soon as their
	// retention ends. The default is 15 minutes.
	PurgeGrace time.Duration

	// DailyPartitions (PostgreSQL only) selects the partitioned layout: the
	// table is partitioned by day of expires_at (UTC), and the purge drops
	// whole partitions once every record in them has expired, instead of
	// deleting rows. The purge job creates the partitions
	// PartitionDaysAhead+1 days ahead, so PurgeInterval must be positive
	// and at most a day (hourly is plenty; a failed run is retried within
	// a minute). The primary key becomes (id, expires_at); each
	// claim and Begin takes a transaction-level advisory lock on its ids
	// to keep ids unique across partitions, which costs a round trip or
	// two per message. Begin refuses to join a REPEATABLE READ transaction
	// (watermill-sql's PostgreSQL subscriber uses one): its snapshot could
	// miss a record committed in another partition. See README.md.
	DailyPartitions bool

	// PartitionDaysAhead is how many days a lease or retention may last on
	// the partitioned layout; longer ones fail with
	// stores.ErrInvalidArgument. Partitions exist one more day ahead (see
	// DailyPartitions). The default is 8; at most 366.
	PartitionDaysAhead int

	// JoinWatermillTx makes Begin join a watermill-sql subscriber's
	// transaction carried by ctx, with a SAVEPOINT, so that the offset ack,
	// the dedup record and the handler's writes commit together; the
	// subscriber's database must be the one holding the table. By default
	// Begin opens its own transaction. A transaction given with WithTx is
	// always joined.
	//
	// Opt in only with a subscriber AckDeadline longer than any handler
	// can run: watermill-sql v3 commits its transaction when the deadline
	// passes even while the handler still runs, which commits the dedup
	// record without the handler's effect — the redelivery is then acked as
	// a duplicate and the effect is lost.
	JoinWatermillTx bool

	// Batch configures group commit of lease-mode calls: concurrent
	// single-key Claims, Completes, Releases and Extends share statements
	// and commits. It is on by default; see BatchConfig.
	Batch BatchConfig

	// Logger receives purge failures. nil means watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if _, ok := dialects[c.Dialect]; !ok && c.Dialect != "" {
		return fmt.Errorf("sqlstore: Dialect must be %q, %q or %q, got %q", Postgres, MySQL, SQLite, c.Dialect)
	}
	if c.Table != "" {
		if err := checkTable(c.Table, c.Dialect); err != nil {
			return err
		}
	}
	if c.PurgeInterval < 0 {
		return fmt.Errorf("sqlstore: PurgeInterval must not be negative, got %s", c.PurgeInterval)
	}
	if c.PurgeBatch < 0 || c.PurgeBatch > MaxPurgeBatch {
		return fmt.Errorf("sqlstore: PurgeBatch must be between 1 and %d (0 for the default), got %d", MaxPurgeBatch, c.PurgeBatch)
	}
	if c.PurgeGrace < 0 {
		return fmt.Errorf("sqlstore: PurgeGrace must not be negative, got %s", c.PurgeGrace)
	}
	if c.PartitionDaysAhead < 0 || c.PartitionDaysAhead > 366 {
		return fmt.Errorf("sqlstore: PartitionDaysAhead must be between 1 and 366 (0 for the default), got %d", c.PartitionDaysAhead)
	}
	if err := c.Batch.Validate(batchLimits); err != nil {
		return fmt.Errorf("sqlstore: %w", err)
	}
	if c.DailyPartitions {
		if c.Dialect != "" && !dialects[c.Dialect].partitions {
			return fmt.Errorf("sqlstore: DailyPartitions is for PostgreSQL only, Dialect is %q", c.Dialect)
		}
		if c.PurgeInterval <= 0 || c.PurgeInterval > 24*time.Hour {
			return fmt.Errorf("sqlstore: DailyPartitions needs a PurgeInterval between 0 and 24h (the purge job creates the partitions ahead, at least once a day), got %s", c.PurgeInterval)
		}
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	if c.PurgeGrace == 0 {
		c.PurgeGrace = DefaultPurgeGrace
	}
	if c.PartitionDaysAhead == 0 {
		c.PartitionDaysAhead = DefaultPartitionDaysAhead
	}
	c.Batch = c.Batch.WithDefaults(batchLimits)
	c.Clock = stores.ClockOrSystem(c.Clock)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

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

	// onPurgeBatch, when set (by tests), sees the size of every batch.
	onPurgeBatch func(n int64)
	// purgeChunk is the number of heap blocks a PostgreSQL purge
	// statement reads (purgeChunkBlocks; tests make it small).
	purgeChunk int64
}

var (
	_ stores.Store = (*Store)(nil)
	_ stores.Inbox = (*Store)(nil)
)

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
		s.group = newGroup(s)
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

// checkHorizon fails for a lease or retention that would put expires_at
// past the partitions created ahead.
func (s *Store) checkHorizon(what string, d time.Duration) error {
	if s.part != nil && d > time.Duration(s.cfg.PartitionDaysAhead)*24*time.Hour {
		return fmt.Errorf("%w: %s %s is longer than PartitionDaysAhead (%d days)", stores.ErrInvalidArgument, what, d, s.cfg.PartitionDaysAhead)
	}
	return nil
}

// acquire makes sure every key of ks has a record in tx: it inserts the
// missing ones with insert (arguments from args) and returns the ids that
// already had one, with their records, locked. On the plain layout the
// INSERT ... ON CONFLICT DO NOTHING comes first (one statement in the
// common case, and it waits for a concurrent uncommitted insert of the
// same id); on the partitioned layout the ids' locks come first, then a
// locking read across partitions, then the inserts.
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
	for _, id := range ks.ids {
		res, err := tx.ExecContext(ctx, insert, args(id)...)
		if err != nil {
			return nil, nil, err
		}
		if ins, err := s.d.inserted(res); err != nil {
			return nil, nil, err
		} else if !ins {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return nil, nil, nil
	}
	recs, err := fetch(ctx, tx, s.d, rest, now, true)
	if err != nil {
		return nil, nil, err
	}
	if len(recs) != len(rest) {
		return nil, nil, errRetry // deleted between our INSERT and SELECT
	}
	return rest, recs, nil
}

// RecordID returns the primary key of (scope, key): the first 16 bytes of
// SHA-256 over a length-prefixed encoding of both, so no two pairs share an
// encoding. On PostgreSQL the id column shows it as a uuid. Use it to find
// a key's record by hand.
//
// A 128-bit digest keeps rows small and index entries fixed-size whatever
// the key length. Two distinct pairs collide with probability about
// n²/2^129 for n live records (below 10^-14 for a trillion records); a
// collision would make one key a false duplicate of the other.
func RecordID(scope, key string) [16]byte {
	return digest(scope, key)
}

func digest(scope, key string) recordID {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("watermill-dedup/sqlstore/v1\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	var id recordID
	copy(id[:], h.Sum(nil))
	return id
}

func newKeySet(scope string, keys []string) keySet {
	ks := keySet{order: make([]recordID, len(keys))}
	for i, k := range keys {
		ks.order[i] = digest(scope, k)
	}
	ks.ids = slices.Clone(ks.order)
	slices.SortFunc(ks.ids, func(a, b recordID) int { return bytes.Compare(a[:], b[:]) })
	ks.ids = slices.Compact(ks.ids)
	return ks
}

// now is the clock's time at the database's (microsecond) precision.
func (s *Store) now() time.Time { return s.cfg.Clock.Now().Truncate(time.Microsecond) }

// newToken returns a random positive 63-bit fencing token.
func newToken() int64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	t := int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	if t == 0 {
		t = 1
	}
	return t
}

// orderKeys returns the idKeys of ks's ids in the caller's order.
func (s *Store) orderKeys(ks keySet) []string {
	keys := make([]string, len(ks.order))
	for i, id := range ks.order {
		keys[i] = idKey(s.d, id)
	}
	return keys
}

// inTx runs fn in a short transaction of the store's own.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return inTx(ctx, s.db, s.qk.txOptions, fn)
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

// checkCall is [stores.CheckCall], then the session check: every
// failure a call meets before its own statements.
func (s *Store) checkCall(ctx context.Context, args ...error) error {
	if err := stores.CheckCall(ctx, s.closed.Load(), args...); err != nil {
		return err
	}
	return s.checkSession(ctx)
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
	if err := s.checkCall(ctx, stores.CheckKeys(keys), stores.CheckLease(lease), s.checkHorizon("lease", lease)); err != nil {
		return nil, fmt.Errorf("sqlstore: claim: %w", err)
	}
	s.noteLease(lease)
	ks := newKeySet(scope, keys)
	token := newToken()
	c := &stores.Claim{Scope: scope, Keys: keys}
	var err error
	if o := s.group.op(ctx, opClaim, ks); o != nil {
		o.token, o.d = token, lease
		if err = s.group.do(ctx, o); err == nil {
			// Only now is o.res the caller's: a batch that went on
			// without a caller that gave up writes it still.
			c.Result, c.Takeover, c.Data = o.res.Result, o.res.Takeover, o.res.Data
		}
	} else {
		err = s.claimDirect(ctx, ks, token, lease, c)
	}
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim in scope %q: %w", scope, s.classify(err))
	}
	if c.Result == stores.Claimed {
		c.Token = strconv.FormatInt(token, 36)
	}
	return c, nil
}

// claimDirect claims ks on its own statements, retrying transient
// conflicts.
func (s *Store) claimDirect(ctx context.Context, ks keySet, token int64, lease time.Duration, c *stores.Claim) error {
	return s.retry(ctx, func() error { return s.claimOnce(ctx, ks, token, lease, c) })
}

func (s *Store) claimOnce(ctx context.Context, ks keySet, token int64, lease time.Duration, c *stores.Claim) error {
	now := s.now()
	exp := s.d.timeArg(now.Add(lease))
	c.Result, c.Takeover, c.Data = 0, false, nil
	if len(ks.ids) == 1 && s.part == nil {
		res, err := s.db.ExecContext(ctx, s.q.insertProcessing, s.d.idArg(ks.ids[0]), token, exp)
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
			if c.Result, c.Data, _ = decide(recs, s.orderKeys(ks), token); c.Result != 0 {
				return nil
			}
		}
		// Expired (or gone since the INSERT): take over under a lock.
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		rest, recs, err := s.acquire(ctx, tx, ks, now, s.q.insertProcessing, func(id recordID) []any {
			return []any{s.d.idArg(id), token, exp}
		})
		if err != nil {
			return err
		}
		c.Result, c.Data, c.Takeover = decide(recs, s.orderKeys(ks), token)
		switch c.Result {
		case stores.Claimed:
			return nil
		case stores.Duplicate, stores.InProgress:
			return errRollback // undo the records we inserted
		}
		if _, err := tx.ExecContext(ctx, s.q.takeover(len(rest)), idArgs(s.d, []any{token, exp}, rest)...); err != nil {
			return err
		}
		c.Result = stores.Claimed
		return nil
	})
}

// claimArgs checks a call on claim c (Complete, Release, Extend), whose
// other arguments' checks are args, and returns c's keys and token.
func (s *Store) claimArgs(ctx context.Context, c *stores.Claim, args ...error) (keySet, int64, error) {
	var token int64
	err := stores.CheckClaim(c)
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

// opError prefixes the error of a Complete, Release or Extend.
func (s *Store) opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sqlstore: %s: %w", op, s.classify(err))
}

// Complete implements [stores.Store].
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	ks, token, err := s.claimArgs(ctx, c, stores.CheckRetention(retention), s.checkHorizon("retention", retention))
	if err != nil {
		return s.opError("complete", err)
	}
	if o := s.group.op(ctx, opComplete, ks); o != nil {
		o.claim, o.token, o.d, o.data = c, token, retention, data
		return s.opError("complete", s.group.do(ctx, o))
	}
	return s.opError("complete", s.completeDirect(ctx, c, ks, token, retention, data))
}

func (s *Store) completeDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64, retention time.Duration, data []byte) error {
	exp := s.d.timeArg(s.now().Add(retention))
	return s.fenced(ctx, c, ks, token, s.q.complete(len(ks.ids)), []any{exp, dataArg(data)}, false)
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	ks, token, err := s.claimArgs(ctx, c)
	if err != nil {
		return s.opError("release", err)
	}
	if o := s.group.op(ctx, opRelease, ks); o != nil {
		o.claim, o.token = c, token
		return s.opError("release", s.group.do(ctx, o))
	}
	return s.opError("release", s.releaseDirect(ctx, c, ks, token))
}

func (s *Store) releaseDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64) error {
	return s.fenced(ctx, c, ks, token, s.q.release(len(ks.ids)), nil, false)
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	ks, token, err := s.claimArgs(ctx, c, stores.CheckLease(lease), s.checkHorizon("lease", lease))
	if err != nil {
		return s.opError("extend", err)
	}
	s.noteLease(lease)
	if o := s.group.op(ctx, opExtend, ks); o != nil {
		o.claim, o.token, o.d = c, token, lease
		return s.opError("extend", s.group.do(ctx, o))
	}
	return s.opError("extend", s.extendDirect(ctx, c, ks, token, lease))
}

func (s *Store) extendDirect(ctx context.Context, c *stores.Claim, ks keySet, token int64, lease time.Duration) error {
	exp := s.d.timeArg(s.now().Add(lease))
	return s.fenced(ctx, c, ks, token, s.q.extend(len(ks.ids)), []any{exp}, true)
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
	if err := s.d.checkSession(ctx, s.db); err != nil {
		if !errors.Is(err, ErrSessionSettings) {
			return s.classify(err) // not known yet: checked again next time
		}
		s.sessionErr = err
	}
	s.sessionChecked.Store(true)
	return s.sessionErr
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

// SQLiteDSN returns a modernc.org/sqlite data source name for the database
// file at path with the settings the store needs under concurrency: a busy
// timeout (writers wait for the database lock instead of failing with
// SQLITE_BUSY), WAL journaling (readers do not block the writer) and
// BEGIN IMMEDIATE transactions (a handler that reads before it writes
// cannot fail to upgrade its lock). synchronous stays FULL: a commit the
// broker was acked for must survive a power cut.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
}

// classify marks an error of a database that cannot be reached, or says
// it cannot serve now, with stores.ErrUnavailable (the outage class of the
// stores contract). Other errors are returned as they are.
func (s *Store) classify(err error) error {
	if err == nil || errors.Is(err, stores.ErrUnavailable) || !s.is(err, errUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
}

// is reports whether err belongs to class c: the failures every driver
// shares, then the dialect's own.
func (s *Store) is(err error, c errClass) bool {
	if err == nil {
		return false
	}
	switch c {
	case errUnavailable:
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// The caller's context ended: its own class, not an outage
			// (context.DeadlineExceeded is also a net.Error).
			return false
		}
		if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
			return true
		}
		var ne net.Error
		if errors.As(err, &ne) {
			return true
		}
	case errRetryable:
		if errors.Is(err, errRetry) {
			return true
		}
	}
	return s.d.classify(err)&c != 0
}

// joinedError marks err with stores.ErrTxAborted when it says that the
// transaction a joined Begin works in is over.
func (s *Store) joinedError(err error) error {
	if s.is(err, errTxDead) && !errors.Is(err, stores.ErrTxAborted) {
		return fmt.Errorf("%w: %w", stores.ErrTxAborted, err)
	}
	return err
}
