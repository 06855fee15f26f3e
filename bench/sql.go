package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// sqlBench is an open database with a store on a table of its own.
type sqlBench struct {
	name  string
	db    *sql.DB
	store *sqlstore.Store
	drop  func()
}

// openSQL opens kind's store on a new table with a pool of conns, and
// names the service and its setting when it is unreachable.
func openSQL(ctx context.Context, kind anystore.StoreKind, conns int) (*sqlBench, error) {
	o, cleanup, err := anystore.OpenStore(ctx, anystore.StoreParams{
		Kind:         kind,
		Name:         "dedup_bench_" + runID(),
		PoolSize:     conns,
		CreateSchema: true,
		Teardown:     true,
	})
	if err != nil {
		return nil, err
	}
	return &sqlBench{name: string(kind), db: o.DB, store: o.Store.(*sqlstore.Store), drop: func() {
		_ = cleanup(context.Background())
	}}, nil
}

var passwordRe = regexp.MustCompile(`:[^:@/]*@`)

func redactDSN(dsn string) string { return passwordRe.ReplaceAllString(dsn, ":***@") }

func openPostgresBench(ctx context.Context) (*benchStore, error) {
	b, err := openSQL(ctx, anystore.StorePostgres, 32)
	if err != nil {
		return nil, err
	}
	table := b.store.Table()
	return &benchStore{
		name:  "postgres",
		store: b.store,
		mem: func(ctx context.Context) (int64, error) {
			if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+table); err != nil {
				return 0, err
			}
			var n int64
			err := b.db.QueryRowContext(ctx, "SELECT pg_total_relation_size($1)", table).Scan(&n)
			return n, err
		},
		cleanup: b.drop,
	}, nil
}

// txThroughput runs Begin+Commit cycles of new keys with c workers for d.
func txThroughput(ctx context.Context, inbox stores.Inbox, workers int, d time.Duration, keyPrefix string) (float64, error) {
	return rate(workers, d, func(w, i int) error {
		tx, err := inbox.Begin(ctx, "bench", []string{keyPrefix + strconv.Itoa(w) + "-" + strconv.Itoa(i)}, time.Hour)
		if err != nil {
			return err
		}
		return tx.Commit(ctx, nil)
	})
}

// freshTx runs measure on a store on a new table of db, dropped after.
func freshTx(ctx context.Context, db *sql.DB, measure func(stores.Inbox) (float64, error)) (float64, error) {
	table := "dedup_bench_tx_" + runID()
	s, err := sqlstore.New(db, sqlstore.Config{Table: table})
	if err != nil {
		return 0, err
	}
	defer func() {
		_ = s.Close(context.Background())
		dropTable(db, table)
	}()
	if err := s.CreateSchema(ctx); err != nil {
		return 0, err
	}
	return measure(s)
}

// dbsqlTx runs pgbench's BEGIN, INSERT ... ON CONFLICT DO NOTHING,
// COMMIT script through database/sql and pgx, the driver the store uses,
// with c workers for d, and returns transactions per second: the floor
// of a transactional inbox in Go, without the store.
func dbsqlTx(ctx context.Context, db *sql.DB, workers int, d time.Duration) (float64, error) {
	table := "dedup_dbsql_" + runID()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (k text PRIMARY KEY)"); err != nil {
		return 0, err
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) //nolint:errcheck
	insert := "INSERT INTO " + table + " (k) VALUES ($1) ON CONFLICT DO NOTHING"
	return rate(workers, d, func(w, i int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insert, "b0e6c1e4-5f2a-4c0d-"+strconv.Itoa(w)+"-"+strconv.Itoa(i)); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

var tpsRe = regexp.MustCompile(`tps = ([0-9.]+)`)

// pgbench runs a single-row INSERT ... ON CONFLICT DO NOTHING script with c
// clients for d into a scratch table, and returns its tps. With inTx the
// INSERT runs between BEGIN and COMMIT: the three round trips of a
// transaction that database/sql opens, writes once and commits.
func pgbench(ctx context.Context, db *sql.DB, clients int, d time.Duration, inTx bool) (float64, error) {
	bin, err := exec.LookPath("pgbench")
	if err != nil {
		for _, p := range []string{"/usr/lib/postgresql/15/bin/pgbench", "/usr/lib/postgresql/16/bin/pgbench", "/usr/lib/postgresql/17/bin/pgbench"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
		if err != nil {
			return 0, fmt.Errorf("pgbench is not installed")
		}
	}
	table := "dedup_pgbench_" + runID()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (k text PRIMARY KEY)"); err != nil {
		return 0, err
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) //nolint:errcheck
	dir, err := os.MkdirTemp("", "pgbench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "insert.sql")
	body := "\\set k random(1, 1000000000000)\nINSERT INTO " + table + " (k) VALUES ('b0e6c1e4-5f2a-4c0d-' || :k) ON CONFLICT DO NOTHING;\n"
	if inTx {
		body = "\\set k random(1, 1000000000000)\nBEGIN;\nINSERT INTO " + table + " (k) VALUES ('b0e6c1e4-5f2a-4c0d-' || :k) ON CONFLICT DO NOTHING;\nCOMMIT;\n"
	}
	if err := os.WriteFile(script, []byte(body), 0o600); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, bin, "-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script, testkit.PostgresDSN())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w: %s", err, out)
	}
	m := tpsRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps: %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// runSQL compares sqlstore on PostgreSQL (lease: claim+complete;
// transactional: begin+commit) at 1 and 16 concurrent handlers with
// pgbench's single-row INSERT ... ON CONFLICT DO NOTHING, and reports MySQL
// and SQLite beside them.
func runSQL(ctx context.Context, o *options) ([]result, error) {
	const sec = "sql"
	d, rounds := 3*time.Second, 3
	if o.quick {
		d, rounds = time.Second, 1
	}
	var rs []result
	for _, kind := range []anystore.StoreKind{anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreSQLite} {
		b, err := openSQL(ctx, kind, 32)
		if err != nil {
			rs = append(rs, skipped(sec, err.Error())...)
			continue
		}
		for _, c := range []int{1, 16} {
			if b.name == "postgres" {
				prs, err := comparePostgres(ctx, b, c, d, rounds)
				rs = append(rs, prs...)
				if err != nil {
					b.drop()
					return rs, err
				}
				continue
			}
			lease, err := throughput(ctx, b.store, c, d, fmt.Sprintf("l%d-", c))
			if err != nil {
				b.drop()
				return rs, fmt.Errorf("%s lease: %w", b.name, err)
			}
			tx, err := txThroughput(ctx, b.store, c, d, fmt.Sprintf("t%d-", c))
			if err != nil {
				b.drop()
				return rs, fmt.Errorf("%s transactional: %w", b.name, err)
			}
			rs = append(rs,
				result{sec, fmt.Sprintf("sql_%s_lease_c%d_msgs_per_s", b.name, c), lease, "msgs/s", "claim+complete"},
				result{sec, fmt.Sprintf("sql_%s_tx_c%d_msgs_per_s", b.name, c), tx, "msgs/s", "begin+commit"},
			)
		}
		b.drop()
	}
	return rs, nil
}

// comparePostgres measures lease mode, transactional mode and pgbench in
// turn, rounds times, and reports the median of each rate and of each
// round's ratios: on a shared machine the load drifts between runs taken
// seconds apart, and a ratio of figures taken side by side drifts less.
func comparePostgres(ctx context.Context, b *sqlBench, c int, d time.Duration, rounds int) ([]result, error) {
	const sec = "sql"
	var leases, txs, pbs, pbtxs, dbtxs, leaseRatios, txRatios, dbRatios []float64
	for r := range rounds {
		lease, err := throughput(ctx, b.store, c, d, fmt.Sprintf("l%d-%d-", c, r))
		if err != nil {
			return nil, fmt.Errorf("postgres lease: %w", err)
		}
		// Transactional mode on a table of its own, new each round, as
		// the database/sql loop below has: not on the table lease mode
		// has just filled with updated rows (and autovacuum may be
		// cleaning).
		tx, err := freshTx(ctx, b.db, func(inbox stores.Inbox) (float64, error) {
			return txThroughput(ctx, inbox, c, d, fmt.Sprintf("t%d-%d-", c, r))
		})
		if err != nil {
			return nil, fmt.Errorf("postgres transactional: %w", err)
		}
		leases, txs = append(leases, lease), append(txs, tx)
		pb, err := pgbench(ctx, b.db, c, d, false)
		if err == nil {
			var pbtx float64
			pbtx, err = pgbench(ctx, b.db, c, d, true)
			pbtxs = append(pbtxs, pbtx)
		}
		if err != nil {
			// No pgbench: the store's own rates, and a note instead of
			// the ratios.
			return append([]result{
				{sec, fmt.Sprintf("sql_postgres_lease_c%d_msgs_per_s", c), lease, "msgs/s", "claim+complete"},
				{sec, fmt.Sprintf("sql_postgres_tx_c%d_msgs_per_s", c), tx, "msgs/s", "begin+commit"},
			}, skipped(sec, err.Error())...), nil
		}
		pbs = append(pbs, pb)
		leaseRatios, txRatios = append(leaseRatios, lease/pb), append(txRatios, tx/pb)
		dbtx, err := dbsqlTx(ctx, b.db, c, d)
		if err != nil {
			return nil, fmt.Errorf("database/sql transactions: %w", err)
		}
		dbtxs, dbRatios = append(dbtxs, dbtx), append(dbRatios, tx/dbtx)
	}
	note := fmt.Sprintf("median of %d rounds", rounds)
	return []result{
		{sec, fmt.Sprintf("sql_postgres_lease_c%d_msgs_per_s", c), median(leases), "msgs/s", "claim+complete, " + note},
		{sec, fmt.Sprintf("sql_postgres_tx_c%d_msgs_per_s", c), median(txs), "msgs/s", "begin+commit, " + note},
		{sec, fmt.Sprintf("pgbench_insert_c%d_tps", c), median(pbs), "tps", "single-row INSERT ON CONFLICT DO NOTHING, " + note},
		{sec, fmt.Sprintf("pgbench_begin_insert_commit_c%d_tps", c), median(pbtxs), "tps", "the same INSERT between BEGIN and COMMIT (3 round trips, as a transactional inbox), " + note},
		{sec, fmt.Sprintf("dbsql_begin_insert_commit_c%d_tps", c), median(dbtxs), "tps", "pgbench's BEGIN/INSERT/COMMIT through database/sql and pgx, the store's driver, " + note},
		{sec, fmt.Sprintf("dbsql_tx_vs_pgbench_tx_c%d_ratio", c), median(dbtxs) / median(pbtxs), "x", "the Go driver against pgbench, the same statements"},
		{sec, fmt.Sprintf("sql_postgres_tx_vs_pgbench_tx_c%d_ratio", c), median(txs) / median(pbtxs), "x", goalNote(c == 16, "goal >= 0.9; ") + "transactional mode against its floor"},
		{sec, fmt.Sprintf("sql_postgres_tx_vs_dbsql_tx_c%d_ratio", c), median(dbRatios), "x", "transactional mode against the same transaction through its driver; median of the rounds' ratios"},
		{sec, fmt.Sprintf("sql_postgres_lease_vs_pgbench_c%d_ratio", c), median(leaseRatios), "x", goalNote(c == 16, "goal >= 1.0; ") + "median of the rounds' ratios"},
		{sec, fmt.Sprintf("sql_postgres_tx_vs_pgbench_c%d_ratio", c), median(txRatios), "x", goalNote(c == 16, "goal >= 0.8; ") + "median of the rounds' ratios"},
	}, nil
}
