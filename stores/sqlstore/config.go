package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/batch"
)

// The configuration of a Store: Config, its defaults and validation, the
// dialects to pick from (each described by its own file) and their
// detection from the driver, and BatchConfig.

// Dialect names the SQL flavour of the database behind a Store.
type Dialect string

// The supported dialects.
const (
	// Postgres is PostgreSQL 11 or later, through
	// github.com/jackc/pgx/v5/stdlib (or any driver returning errors with a
	// SQLState() method, such as lib/pq).
	Postgres Dialect = "postgres"
	// MySQL is MySQL 8 or MariaDB 10.5 or later, through
	// github.com/go-sql-driver/mysql.
	MySQL Dialect = "mysql"
	// SQLite is SQLite 3.35 or later, through modernc.org/sqlite (no cgo)
	// or github.com/mattn/go-sqlite3. The latter waits for the database's
	// write lock for its DSN's _busy_timeout whatever the statement's
	// context: Begin is bounded by its context all the same (its
	// statements run in a goroutine it stops waiting for), lease-mode
	// calls only by that busy timeout.
	SQLite Dialect = "sqlite"
)

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

	// PurgeJobElsewhere (DailyPartitions only) says that the purge job,
	// which creates the partitions ahead and drops the expired ones, runs
	// in another process: a store on the same table, with PurgeInterval
	// set, connected as a role that owns the table (creating and dropping
	// partitions needs that). This store then runs none, and PurgeInterval
	// must be 0: it needs no privilege but SELECT, INSERT, UPDATE and
	// DELETE on the table, and runs no DDL. If no job runs at least daily,
	// writes fail once the partitions made ahead run out. Its Purge (and
	// dedupctl purge) still runs the job, and fails for a role that may
	// not. See README.md, "Least privilege".
	PurgeJobElsewhere bool

	// PartitionDaysAhead is how many days a lease or retention may last on
	// the partitioned layout; longer ones fail with
	// stores.ErrInvalidArgument. Partitions exist one more day ahead (see
	// DailyPartitions). The default is 8; at most 366.
	PartitionDaysAhead int

	// JoinTx makes Begin join the transaction it finds in ctx, with a
	// SAVEPOINT: a watermill-sql subscriber's, so that the offset ack, the
	// dedup record and the handler's writes commit together. Set it to
	// the finder of the subscriber's major, and build the subscriber with
	// the same package: wsql3.SubscriberTx and wsql3.NewSubscriber
	// (github.com/watermill-dedup/dedup/stores/sqlstore/wsql3) for
	// watermill-sql v3, wsql4.SubscriberTx and wsql4.NewSubscriber
	// (.../stores/sqlstore/wsql4) for v4. watermill-sql commits its
	// transaction whenever a delivery ends, acked or not (the subscriber
	// closing, its AckDeadline passing); those subscribers commit only
	// what the router acked, and the finders refuse the transaction of
	// any other (Begin fails with ErrTxNotJoinable). The subscriber's
	// database must be the one holding the table. nil (the default):
	// Begin opens its own transaction. A transaction given with WithTx is
	// always joined.
	//
	// A handler that outlives the subscriber's AckDeadline has its
	// batch rolled back and delivered again, its effect with it; so has a
	// batch whose transaction the database aborted (a MySQL deadlock). v4
	// also takes an AckDeadline of 0, no deadline: the transaction then
	// stays open as long as the handler runs (on PostgreSQL its snapshot
	// holds back every subscriber of the database meanwhile). The store's
	// *sql.DB needs a connection of its own beside the subscriber's
	// transaction: on MySQL its first call reads the session's settings.
	JoinTx TxFinder

	// Deprecated: set JoinTx to wsql3.SubscriberTx, which finds the
	// transaction this found (watermill-sql v3's). sqlstore imports no
	// watermill-sql major, so that a build on v4 compiles nothing of v3:
	// New refuses JoinWatermillTx without JoinTx, naming the fix, rather
	// than have Begin open a transaction of its own where the handler
	// expects the subscriber's. With JoinTx set it changes nothing.
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
	if c.JoinWatermillTx && c.JoinTx == nil {
		return errJoinWatermillTx
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
		switch {
		case c.PurgeJobElsewhere && c.PurgeInterval != 0:
			return fmt.Errorf("sqlstore: PurgeJobElsewhere runs no purge job: PurgeInterval must be 0, got %s", c.PurgeInterval)
		case !c.PurgeJobElsewhere && (c.PurgeInterval <= 0 || c.PurgeInterval > 24*time.Hour):
			// The purge job creates the partitions ahead, at least once a
			// day; PurgeJobElsewhere when another process runs it.
			return fmt.Errorf("sqlstore: DailyPartitions needs a PurgeInterval between 0 and 24h, or PurgeJobElsewhere, got %s", c.PurgeInterval)
		}
	} else if c.PurgeJobElsewhere {
		return errors.New("sqlstore: PurgeJobElsewhere is for DailyPartitions; on the plain layout a PurgeInterval of 0 runs no purge job")
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
// with the load by themselves. The exception is a call whose context
// carries a stores.WithLinger (the middleware's background Complete): it
// waits up to that long to go out in the batch of the next call.
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
