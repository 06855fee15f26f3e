package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// DropTables drops the tables of a database of dialect d, and only those
// (never TRUNCATE or drop a shared database). A name is quoted for the
// dialect unless it is already: watermill-sql's adapters return their
// table names quoted. It tries every table and returns what failed. In a
// Cleanup, pass a context of its own: the test's has ended by then.
func DropTables(ctx context.Context, db *sql.DB, d sqlstore.Dialect, tables ...string) error {
	if db == nil {
		return errors.New("sqltest: DropTables: no database")
	}
	quote := `"`
	if d == sqlstore.MySQL {
		quote = "`"
	}
	var errs []error
	for _, table := range tables {
		name := table
		if !strings.HasPrefix(name, `"`) && !strings.HasPrefix(name, "`") {
			name = quote + name + quote
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", table, err))
		}
	}
	return errors.Join(errs...)
}
