package sqlstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/internal/batch"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The Store: its configuration, its state, and what its parts (group.go,
// purge.go, inbox.go) and its face (sqlstore.go: New, the lease-mode
// calls, Close) share: the dialects the constructor picks from, keys,
// retries, error classes, the session check and the unbatched lease-mode
// statements. The group's type stands here beside the Store's, as each
// holds the other; its methods are in group.go.

// ErrInvalidTable is returned by Config.Validate and New for a table name
// that is not a plain identifier. No SQL is ever built from such a name.
var ErrInvalidTable = errors.New("sqlstore: invalid table name")

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

// dialects are the supported dialects, each described by its own file.
var dialects = map[Dialect]dialectInfo{
	Postgres: postgresInfo,
	MySQL:    mysqlInfo,
	SQLite:   sqliteInfo,
}

// DetectDialect returns the dialect of db's driver: pgx or lib/pq are
// Postgres, go-sql-driver/mysql is MySQL, modernc.org/sqlite or
// mattn/go-sqlite3 are SQLite. It fails for any other driver; set
// Config.Dialect then.
func DetectDialect(db *sql.DB) (Dialect, error) {
	pkg := driverPkg(db)
	for name, info := range dialects {
		for _, d := range info.drivers {
			if strings.Contains(pkg, d) {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("sqlstore: cannot tell the dialect of driver %T (package %s): set Config.Dialect", db.Driver(), pkg)
}

// identPart is the strict pattern of a table name (and of its optional
// schema prefix): lowercase ASCII letters, digits and underscores, not
// starting with a digit. Lowercase only, so the name means the same table
// quoted or not, on every dialect and file system.
var identPart = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxTableLen bounds the table part of the name, leaving room for the
// suffixes of index and partition names within PostgreSQL's 63 bytes.
const maxTableLen = 48

// checkTable validates a table name, "table" or "schema.table" (the schema
// form is not available on SQLite).
func checkTable(name string, d Dialect) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 || (len(parts) == 2 && dialects[d].noSchema) {
		return fmt.Errorf("%w: Table %q: want table or schema.table (schema not on SQLite)", ErrInvalidTable, name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return fmt.Errorf("%w: Table %q must match %s (lowercase letters, digits, underscores)", ErrInvalidTable, name, identPart)
		}
		if len(p) > 63 {
			return fmt.Errorf("%w: Table %q: %q is longer than 63 bytes", ErrInvalidTable, name, p)
		}
	}
	if t := parts[len(parts)-1]; len(t) > maxTableLen {
		return fmt.Errorf("%w: Table %q: table part must be at most %d bytes, got %d", ErrInvalidTable, name, maxTableLen, len(t))
	}
	return nil
}

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

	// MaxData is the most bytes of data a record keeps
	// (Capabilities().MaxData): Complete and InboxTx.Commit refuse more
	// with stores.ErrTooLarge before any I/O. The default, and the most
	// it may be, is the dialect's: MaxDataPostgres, MaxDataMySQL,
	// MaxDataSQLite. On MySQL a statement must also fit the server's
	// max_allowed_packet: the store reads it at its first call and, when
	// it cannot carry MaxData, logs an error through Logger and refuses
	// data over what it carries, before any I/O, too.
	MaxData int

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
	if limit := dialects[c.Dialect].maxData; c.MaxData < 0 || (c.Dialect != "" && c.MaxData > limit) {
		return fmt.Errorf("sqlstore: MaxData must be between 0 (the dialect's) and the dialect's %d, got %d", limit, c.MaxData)
	}
	if c.PartitionDaysAhead < 0 || c.PartitionDaysAhead > 366 {
		return fmt.Errorf("sqlstore: PartitionDaysAhead must be between 1 and 366 (0 for the default), got %d", c.PartitionDaysAhead)
	}
	if err := batch.Config(c.Batch).Validate(batchLimits); err != nil {
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
	if c.MaxData == 0 {
		c.MaxData = dialects[c.Dialect].maxData
	}
	c.Batch = BatchConfig(batch.Config(c.Batch).WithDefaults(batchLimits))
	c.Clock = stores.ClockOrSystem(c.Clock)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

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
// The zero value turns batching on with the defaults.
type BatchConfig struct {
	// Disabled turns group commit off: every call runs its own
	// statements on a connection of its own.
	Disabled bool

	// MaxBatch is the most calls one batch carries. The default is
	// DefaultMaxBatch (64); at most MaxBatchLimit (1000).
	MaxBatch int

	// MaxInFlight is how many batches run at once, each on a connection
	// of its own; calls arriving while that many run wait for the next
	// batch. Fewer batches in flight make larger batches (fewer
	// statements and commits per call) and longer waits. The default,
	// DefaultMaxInFlight (1), served the most messages per second and the
	// least CPU per message on every dialect on a two-core machine
	// (README.md); on a server with many cores, 2 to 4 can serve more.
	// At most MaxInFlightLimit (64).
	MaxInFlight int
}

// batchLimits are the defaults and bounds of BatchConfig.
var batchLimits = batch.Limits{
	DefaultMaxBatch: DefaultMaxBatch, MaxBatch: MaxBatchLimit,
	DefaultMaxInFlight: DefaultMaxInFlight, MaxInFlight: MaxInFlightLimit,
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
	// serverMaxData is the most data the server takes in a statement,
	// when the session check found it below Config.MaxData; 0 otherwise.
	serverMaxData atomic.Int64

	// onPurgeBatch, when set (by tests), sees the size of every batch.
	onPurgeBatch func(n int64)
	// purgeChunk is the number of heap blocks a PostgreSQL purge
	// statement reads (purgeChunkBlocks; tests make it small).
	purgeChunk int64
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

// checkCall is [storekit.CheckCall], then the session check: every
// failure a call meets before its own statements.
func (s *Store) checkCall(ctx context.Context, args ...error) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), args...); err != nil {
		return err
	}
	return s.checkSession(ctx)
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
			return s.classify(err) // not known yet: checked again next time
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
	if err := s.Capabilities().CheckData(data); err != nil {
		return err
	}
	if limit := s.serverMaxData.Load(); limit > 0 && int64(len(data)) > limit {
		return fmt.Errorf("%w: %d bytes of data, the database takes at most %d in a statement", stores.ErrTooLarge, len(data), limit)
	}
	return nil
}

// classify marks an error of a database that cannot be reached, or says
// it cannot serve now, with stores.ErrUnavailable (the outage class of the
// stores contract). Other errors are returned as they are.
func (s *Store) classify(err error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, stores.ErrTooLarge):
		return err
	case s.is(err, errTooLarge):
		return fmt.Errorf("%w: %w", stores.ErrTooLarge, err)
	case s.is(err, errUnavailable):
		return fmt.Errorf("%w: %w", stores.ErrUnavailable, err)
	}
	return err
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
