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
// # Admin
//
// The Store implements [stores.Admin], which the dedupctl command uses.
// The table keeps the digest of (scope, key), not the pair: Get and
// Delete find a record by its scope and key, List lists records by ID
// (RecordID as a UUID, in its order) and fails with
// [stores.ErrNotSupported] for a scope or a key prefix, and Stats counts
// records by state, not by scope. List and Stats read the whole table.
//
// # Retention
//
// Expired records are never treated as live, whether or not they have been
// deleted. [Store.Purge] deletes them in bounded batches; set
// Config.PurgeInterval to run it in the background.
package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

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
	if err := s.checkCall(ctx, storekit.CheckKeys(keys), storekit.CheckLease(lease), s.checkHorizon("lease", lease)); err != nil {
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
func (s *Store) opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sqlstore: %s: %w", op, s.classify(err))
}

// Complete implements [stores.Store].
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	ks, token, err := s.claimArgs(ctx, c, storekit.CheckRetention(retention), s.checkHorizon("retention", retention), s.Capabilities().CheckData(data))
	if err == nil {
		err = s.checkData(data) // after the session check
	}
	if err != nil {
		return s.opError("complete", err)
	}
	if o := s.group.op(ctx, opComplete, ks); o != nil {
		o.claim, o.token, o.d, o.data = c, token, retention, data
		return s.opError("complete", s.group.do(ctx, o))
	}
	return s.opError("complete", s.completeDirect(ctx, c, ks, token, retention, data))
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

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	ks, token, err := s.claimArgs(ctx, c, storekit.CheckLease(lease), s.checkHorizon("lease", lease))
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

// Capabilities implements [stores.Store]: data up to Config.MaxData; on
// the partitioned layout, leases and retentions of at
// most PartitionDaysAhead days; the Inbox (joining a caller's
// transaction) and Admin interfaces.
func (s *Store) Capabilities() stores.Capabilities {
	c := stores.Capabilities{
		Kind:     "sqlstore (" + string(s.cfg.Dialect) + ")",
		MaxData:  s.cfg.MaxData,
		Admin:    true,
		Inbox:    true,
		JoinedTx: true,
	}
	if s.part != nil {
		c.Kind = "sqlstore (" + string(s.cfg.Dialect) + ", DailyPartitions)"
		c.MaxLease = time.Duration(s.cfg.PartitionDaysAhead) * 24 * time.Hour
		c.MaxRetention = c.MaxLease
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
