// Package sqlpool opens a bounded database/sql pool and checks that the
// server answers before anything uses it.
package sqlpool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Open opens a database/sql pool of conns connections (open and idle;
// none: database/sql's default) and pings it within timeout. It returns
// the ping's error, "no answer within" timeout when that passed, and
// leaves nothing open then.
func Open(ctx context.Context, driver, dsn string, conns int, timeout time.Duration) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	if conns > 0 {
		// A bounded pool: handlers beyond it wait for a connection
		// instead of exhausting the server's max_connections, which
		// other clients share.
		db.SetMaxOpenConns(conns)
		db.SetMaxIdleConns(conns)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", timeout)
		}
		return nil, err
	}
	return db, nil
}
