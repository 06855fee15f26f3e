package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// partitioned returns st, or, when its table is a PostgreSQL partitioned
// table (sqlstore's DailyPartitions layout), a store of cfg on that
// layout in its place: there a purge drops the partitions whose records
// all expired (and creates those missing ahead, as the consumers' purge
// job does; both need the table's owner), where the plain layout's purge
// would find no row to delete, and deletes take the layout's locks. It
// runs no purge job of its own (PurgeJobElsewhere).
func partitioned(ctx context.Context, db *sql.DB, st *sqlstore.Store, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if st.Dialect() != sqlstore.Postgres {
		return st, nil
	}
	var yes bool
	// A table name that passed sqlstore's check needs no quoting.
	if err := db.QueryRowContext(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass", st.Table()).Scan(&yes); err != nil {
		return nil, fmt.Errorf("reading the layout of the table %s: %w", st.Table(), err)
	}
	if !yes {
		return st, nil
	}
	_ = st.Close(ctx)
	cfg.DailyPartitions, cfg.PurgeJobElsewhere = true, true
	return sqlstore.New(db, cfg)
}
