package sqlstore

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"iter"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/dedup/stores"
)

// PostgreSQL: no state column (the token's nullness is the state), ids
// as uuid, timestamptz, pipelined batches with pgx, and the daily
// partitioned layout.

// MaxDataPostgres is the default and largest Config.MaxData on
// PostgreSQL, 256 MiB - 64 KiB. PostgreSQL allocates at most 1 GiB at
// once, for a bytea value as for a message or a statement's text, and a
// client that sends or reads bytea as text (lib/pq, pgx's simple
// protocol) doubles it in hex: 512 MiB - 64 KiB failed so ("invalid
// memory alloc request size 1073741824"); half of that is taken in every
// mode.
const MaxDataPostgres = 1<<28 - 1<<16

// postgresInfo describes PostgreSQL to New, Validate and DetectDialect.
var postgresInfo = dialectInfo{
	maxData:    MaxDataPostgres,
	drivers:    []string{"jackc/pgx", "lib/pq"},
	partitions: true,
	open: func(table string, partitioned bool, _ *sql.DB) dialect {
		return newPostgres(table, partitioned)
	},
}

type postgresDialect struct {
	base
	q            statements
	schemaName   string // unquoted, "" when none
	name         string // unquoted table name
	partitioned  bool
	lockClass    int32       // partitioned: the advisory lock class of the table
	notPgx       atomic.Bool // a driver other than pgx: no pipelines
	readCommited *sql.TxOptions
}

var (
	_ dialect     = (*postgresDialect)(nil)
	_ partitioner = (*postgresDialect)(nil)
)

func newPostgres(table string, partitioned bool) *postgresDialect {
	d := &postgresDialect{partitioned: partitioned, readCommited: &sql.TxOptions{Isolation: sql.LevelReadCommitted}}
	d.schemaName, d.name = splitTable(table)
	h := fnv.New32a()
	h.Write([]byte("sqlstore:" + table))
	d.lockClass = int32(h.Sum32())

	// The table has no state column: a processing record always has a
	// token and a done record never has one, so the token's nullness is
	// the state, and a done record is 8 bytes smaller (48 instead of 56,
	// with the alignment of its columns).
	q := &d.q
	q.table = d.qualified(d.name)
	q.ph = func(i int) string { return "$" + strconv.Itoa(i) }
	q.setState = func(int) string { return "" }
	q.forUpdate = " FOR UPDATE"
	q.selectFrom = fmt.Sprintf("SELECT id::text, CASE WHEN token IS NULL THEN %d ELSE %d END, "+
		"CASE WHEN expires_at > $1 THEN 1 ELSE 0 END, data, token FROM %s",
		stateDone, stateProcessing, q.table)
	q.setDataTable = q.table
	q.insertProcessing = "INSERT INTO " + q.table + " (id, token, expires_at, data) VALUES ($1, $2, $3, $4)"
	q.insertDone = "INSERT INTO " + q.table + " (id, token, expires_at) VALUES ($1, NULL, $2)"
	if !partitioned {
		// Partitioned: a plain INSERT, made under the id's advisory lock
		// after reading that no row exists.
		q.insertProcessing += " ON CONFLICT (id) DO NOTHING"
		q.insertDone += " ON CONFLICT (id) DO NOTHING"
	}
	return d
}

func (d *postgresDialect) sql() *statements { return &d.q }

func (d *postgresDialect) quote(ident string) string { return `"` + ident + `"` }

func (d *postgresDialect) qualified(name string) string {
	if d.schemaName != "" {
		return d.quote(d.schemaName) + "." + d.quote(name)
	}
	return d.quote(name)
}

func (d *postgresDialect) schema() []string {
	columns := "CREATE TABLE IF NOT EXISTS " + d.q.table + " (\n" +
		"    id         uuid        NOT NULL,\n" +
		"    token      bigint,\n" +
		"    expires_at timestamptz NOT NULL,\n" +
		"    data       bytea,\n"
	if d.partitioned {
		return []string{
			columns +
				"    PRIMARY KEY (id, expires_at)\n" +
				") PARTITION BY RANGE (expires_at)",
		}
	}
	// No index on expires_at: Complete changes it, and an update of an
	// indexed column is never HOT before PostgreSQL 16 (it would add a
	// primary-key entry per record). The purge scans block ranges
	// instead (purgePlan).
	return []string{
		columns +
			"    PRIMARY KEY (id)\n" +
			")",
	}
}

// idArg is a uuid literal, valid in every pgx query mode.
func (d *postgresDialect) idArg(id recordID) any { return id.uuid() }

func (d *postgresDialect) timeArg(t time.Time) any { return roundUp(t).UTC() }

func (d *postgresDialect) inserted(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	return n == 1, err
}

func (d *postgresDialect) quirks() quirks {
	// READ COMMITTED: locking reads see the latest committed row.
	return quirks{txOptions: d.readCommited}
}

// classify: an error with a SQLSTATE is the server's answer; the codes
// of a server that cannot serve now are outages, those of a server that
// refused the client refusals. pgx reports every failure to set up a
// connection as a ConnectError (errConnecting): a known outage only when
// the dial failed (refused, unreachable, timed out: classifier.isOutage)
// or the server said it cannot serve now (57P03 starting or shutting
// down, 53300 out of connections); a server that refused the client (its password,
// its certificate, pg_hba.conf, the database's CONNECT privilege, a
// database that does not exist) refused it, and a connection that broke
// while being set up (a reset, an EOF: how a TLS 1.3 server refusing a
// certificate shows when its close overtakes its alert) is no known
// outage (Store.classify).
//
// 53300 is both a server out of connections (max_connections, or the
// slots left reserved for superusers) and a role or database at the
// CONNECTION LIMIT its administrator set. Nothing but the message's
// text, which lc_messages translates, tells them apart (its Routine
// field names a function of the server's source, no interface): it
// stays an outage, both.
func (d *postgresDialect) classify(err error) errClass {
	var ce *pgconn.ConnectError
	var c errClass
	connecting := errors.As(err, &ce)
	if connecting {
		c = errConnecting
	}
	code, ok := sqlState(err)
	if !ok {
		return c
	}
	switch {
	case code == "08P01", code == "08004": // protocol_violation, sqlserver_rejected_establishment_of_sqlconnection
		return c | errRefused
	case strings.HasPrefix(code, "08"): // connection_exception
		return c | errUnavailable
	case code == "57P01" && !connecting: // admin_shutdown
		// A fast shutdown, and also pg_terminate_backend of the session
		// while the server serves every other: confirmed by a new
		// connection (Store.classify), as a reset is.
		return errConnLost
	case code == "57P01", code == "57P02", code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return c | errUnavailable
	case code == "53300", code == "53100", code == "53200", code == "58030": // too_many_connections, disk_full, out_of_memory, io_error
		return c | errUnavailable
	case strings.HasPrefix(code, "28"): // invalid_authorization_specification (pg_hba.conf, a certificate), invalid_password
		return c | errRefused
	case connecting:
		// Any other refusal of the connection: no CONNECT privilege
		// (42501), no such database (3D000), one not accepting
		// connections (55000).
		return c | errRefused
	case code == "54000": // program_limit_exceeded: a value or message over PostgreSQL's 1 GiB
		return errTooLarge
	case code == "40001", code == "40P01", code == "55P03": // serialization_failure, deadlock_detected, lock_not_available (lock_timeout)
		return errRetryable
	case code == "25P02", code == "3B001": // in_failed_sql_transaction, invalid_savepoint_specification
		// PostgreSQL refuses every statement of a transaction aborted by
		// an earlier error until it is rolled back.
		return errTxDead
	}
	return 0
}

// joinCheck refuses, on the partitioned layout, a REPEATABLE READ
// transaction: its snapshot could miss a record committed in another
// partition. The plain layout joins one, and the partitioned layout a
// READ COMMITTED or SERIALIZABLE one.
func (d *postgresDialect) joinCheck(ctx context.Context, tx *sql.Tx, _ string) error {
	if !d.partitioned {
		return nil
	}
	var iso string
	if err := tx.QueryRowContext(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil {
		return err
	}
	if iso == "repeatable read" {
		return fmt.Errorf("%w: DailyPartitions cannot join a REPEATABLE READ transaction", stores.ErrInvalidArgument)
	}
	return nil
}

// heapBlocks returns the number of blocks of the table's heap and the
// server version. Args: the quoted table name.
const heapBlocks = "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint, current_setting('server_version_num')::int"

// purgeChunkBlocks is the number of heap blocks (8 kB each by default,
// about 100 records) one purge statement reads (purgePlan's chunk, the
// Store's purgeChunk).
const purgeChunkBlocks = 1024

// purgePlan walks the heap once, on PostgreSQL 14 and later, from its
// first block to the last one it had when the purge started, in ranges of
// chunk blocks: a TID range scan reads only those blocks, so no index on
// expires_at is needed, and a purge reads the table once (the cost of
// dropping the index that made every Complete a non-HOT update). Each
// statement deletes a bounded, locked batch by TID, and SKIP LOCKED never
// waits on a row a claim holds. Before PostgreSQL 14 a ctid range is no
// scan bound: one statement per batch scans from the start of the table
// (or uses an index on expires_at if the table has one).
func (d *postgresDialect) purgePlan(ctx context.Context, db *sql.DB, chunk int64) (string, iter.Seq[[]any], error) {
	var blocks int64
	var version int
	if err := db.QueryRowContext(ctx, heapBlocks, d.q.table).Scan(&blocks, &version); err != nil {
		return "", nil, err
	}
	pred := purgePredicate("token IS NULL", "$1", "$2")
	if version < 140000 {
		return fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE %s LIMIT $3 FOR UPDATE SKIP LOCKED)) AND %s",
			d.q.table, d.q.table, pred, pred), one, nil
	}
	stmt := fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s "+
		"WHERE ctid >= $4::text::tid AND ctid < $5::text::tid AND %s LIMIT $3 FOR UPDATE SKIP LOCKED)) AND %s",
		d.q.table, d.q.table, pred, pred)
	return stmt, func(yield func([]any) bool) {
		for from := int64(0); from < blocks; from += chunk {
			if !yield([]any{fmt.Sprintf("(%d,0)", from), fmt.Sprintf("(%d,0)", from+chunk)}) {
				return
			}
		}
	}, nil
}

// adminSyntax: the id as uuid text, the state from the token, times
// through EXTRACT(EPOCH), exact (a numeric) from PostgreSQL 14 on.
func (d *postgresDialect) adminSyntax() adminSyntax {
	return adminSyntax{
		id:    "id::text",
		state: fmt.Sprintf("CASE WHEN token IS NULL THEN %d ELSE %d END", stateDone, stateProcessing),
		micros: func(expr string) string {
			return "(EXTRACT(EPOCH FROM " + expr + ") * 1000000)::bigint"
		},
	}
}

// pgTableSize is the size of the table, its indexes and TOAST, and of
// every partition of it. Args: the quoted table name.
const pgTableSize = "SELECT (pg_total_relation_size($1::regclass) + " +
	"COALESCE((SELECT SUM(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = $1::regclass), 0))::bigint"

func (d *postgresDialect) tableBytes(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, pgTableSize, d.q.table).Scan(&n)
	return n, err
}

// batchSettings are the transaction-local settings of a batch:
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

// batchTag marks the statements a batch runs (see batchSettings).
const batchTag = " /* sqlstore batch */"

// pgxConn is implemented by the driver connections of
// github.com/jackc/pgx/v5/stdlib.
type pgxConn interface{ Conn() *pgx.Conn }

// errNotPgx reports a PostgreSQL driver other than pgx.
var errNotPgx = errors.New("sqlstore: not a pgx connection")

// execBatch sends, with pgx, each call's own single-row statement
// (INSERT ... ON CONFLICT DO NOTHING for a claim, the fenced UPDATE or
// DELETE ... WHERE token = $n AND id = $m otherwise) in one pipeline: one
// network write, one implicit transaction, one commit, and a row count per
// call. The statements are the ones a lone call runs, prepared once per
// connection, each a primary-key lookup planned with sequential scans off
// (batchSettings). A multi-row statement (INSERT ... SELECT FROM
// unnest(...), UPDATE ... FROM unnest(...)) would save little server time
// over the pipeline, and its join plans, cached for the table's size when
// first planned, go wrong as a fresh table grows. With another driver it
// runs them in a transaction (one commit, a round trip each).
func (d *postgresDialect) execBatch(ctx context.Context, db *sql.DB, ops []*op, now time.Time) error {
	if d.notPgx.Load() {
		return execInTx(ctx, db, d, ops, now, batchSettings)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
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
			stmt, args := opStatement(d, o, now)
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
		d.resolveClaims(ctx, c, conflicts, now)
		return nil
	})
	_ = conn.Close()
	if errors.Is(err, errNotPgx) {
		d.notPgx.Store(true)
		return execInTx(ctx, db, d, ops, now, batchSettings)
	}
	return err
}

// resolveClaims decides, after the batch committed, the claims whose
// insert found a record: one read of those records (not locked), in a
// pipeline of its own on the batch's connection, then Duplicate or
// InProgress from a live record. An expired record (a takeover, which
// needs a lock), one gone since, or a failed read leaves the claim to its
// caller.
func (d *postgresDialect) resolveClaims(ctx context.Context, c *pgx.Conn, claims []*op, now time.Time) {
	if len(claims) == 0 {
		return
	}
	ids := make([]recordID, len(claims))
	for i, o := range claims {
		ids[i] = o.id()
	}
	b := &pgx.Batch{}
	b.Queue(batchSettings)
	b.Queue(d.q.selectRows(len(ids), false)+batchTag, idArgs(d, []any{d.timeArg(now)}, ids)...)
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
		r, ok := recs[idKey(d, o.id())]
		if err != nil || !ok || settle(o, r) {
			o.fallback = true
		}
	}
}

// The partitioned layout (Config.DailyPartitions): the table is
// partitioned by day of expires_at (UTC), its primary key is
// (id, expires_at), and uniqueness of id is kept by an advisory lock per
// id (the table's lock class, the id's first 32 bits) taken before
// reading and inserting. Two ids sharing a prefix only wait for each
// other.

const advisoryLock = "SELECT pg_advisory_xact_lock($1, $2)"

func (d *postgresDialect) lockIDs(ctx context.Context, tx *sql.Tx, ids []recordID) error {
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, advisoryLock, d.lockClass, int32(binary.BigEndian.Uint32(id[:4]))); err != nil {
			return err
		}
	}
	return nil
}

// partitionSuffix is appended to the table name for a day's partition.
const partitionSuffix = "_p20060102"

func (d *postgresDialect) partitionName(day time.Time) string {
	return d.name + day.UTC().Format(partitionSuffix)
}

// listPartitions lists the partitions: name and estimated row count.
// Args: the quoted table name.
const listPartitions = `SELECT c.relname, GREATEST(c.reltuples, 0)::bigint FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`

// partitionLockTimeout bounds how long creating or dropping a partition
// waits for its lock on the parent table. Both take a lock that queues
// every claim and Begin behind them, and they wait for any long
// transaction on the table (an open inbox transaction, a slow report):
// give up soon instead, and try again at the next run (within a minute
// after a failed one).
const partitionLockTimeout = "500ms"

// partition is one of the table's partitions.
type partition struct {
	name string
	day  time.Time // the UTC day of expires_at it holds
	rows int64     // estimated (pg_class.reltuples)
}

// partitions lists the table's partitions that this store names.
func (d *postgresDialect) partitions(ctx context.Context, db *sql.DB) (map[string]partition, error) {
	rows, err := db.QueryContext(ctx, listPartitions, d.q.table)
	if err != nil {
		return nil, fmt.Errorf("listing partitions: %w", err)
	}
	defer rows.Close()
	parts := map[string]partition{}
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.rows); err != nil {
			return nil, err
		}
		suffix, ok := strings.CutPrefix(p.name, d.name)
		if !ok {
			continue
		}
		if p.day, err = time.Parse(partitionSuffix, suffix); err != nil {
			continue // not one of ours
		}
		parts[p.name] = p
	}
	return parts, rows.Err()
}

// partitionDDL runs a statement that locks the parent table (creating or
// dropping a partition) under partitionLockTimeout.
func (d *postgresDialect) partitionDDL(ctx context.Context, db *sql.DB, stmt string) error {
	return inTx(ctx, db, d.readCommited, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '"+partitionLockTimeout+"'"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, stmt)
		return err
	})
}

// createPartitions creates the partitions that do not exist yet. The
// extra day after daysAhead is for the records written after the next
// UTC midnight, before the purge job runs again (at most a day later:
// PurgeInterval is at most a day): one with a lease or retention of
// daysAhead days then expires on the day after today+daysAhead. Only a
// missing partition takes the lock on the parent table.
func (d *postgresDialect) createPartitions(ctx context.Context, db *sql.DB, today time.Time, daysAhead int, cutoff time.Time) error {
	parts, err := d.partitions(ctx, db)
	if err != nil {
		return err
	}
	for i := -1; i <= daysAhead+1; i++ {
		day := today.AddDate(0, 0, i)
		if _, ok := parts[d.partitionName(day)]; ok || !day.Add(24*time.Hour).After(cutoff) {
			continue // there, or one the purge would drop at once
		}
		from := day.UTC().Truncate(24 * time.Hour)
		stmt := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
			d.qualified(d.partitionName(from)), d.q.table, from.Format("2006-01-02 15:04:05-07"), from.Add(24*time.Hour).Format("2006-01-02 15:04:05-07"))
		if err := d.partitionDDL(ctx, db, stmt); err != nil {
			// Another process creating the same partition at the same
			// moment: IF NOT EXISTS is not race-free in PostgreSQL.
			if code, _ := sqlState(err); code == "42P07" || code == "23505" {
				continue
			}
			return err
		}
	}
	return nil
}

func (d *postgresDialect) dropPartitions(ctx context.Context, db *sql.DB, cutoff time.Time, dropped func(rows int64)) (int64, error) {
	parts, err := d.partitions(ctx, db)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, p := range parts {
		if p.day.Add(24 * time.Hour).After(cutoff) {
			continue
		}
		if err := d.partitionDDL(ctx, db, "DROP TABLE IF EXISTS "+d.qualified(p.name)); err != nil {
			return total, fmt.Errorf("dropping partition %s: %w", p.name, err)
		}
		total += p.rows
		dropped(p.rows)
	}
	return total, nil
}

// sqlState returns the SQLSTATE of a PostgreSQL error in err's tree (pgx,
// lib/pq, any driver whose errors have a SQLState method).
func sqlState(err error) (string, bool) {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState(), true
	}
	return "", false
}
