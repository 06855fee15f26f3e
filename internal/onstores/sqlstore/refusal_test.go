package sqlstore_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestSQLiteCannotOpenIsNotAnOutage: a database file SQLite cannot open
// (SQLITE_CANTOPEN: a directory that does not exist, a file it may not
// read) is a path or a permission to fix, not an outage.
func TestSQLiteCannotOpenIsNotAnOutage(t *testing.T) {
	for _, driver := range []string{"sqlite", "sqlite3"} {
		t.Run(driver, func(t *testing.T) {
			path := t.TempDir() + "/missing/dedup.db"
			dsn := sqlstore.SQLiteDSN(path)
			if driver == "sqlite" {
				dsn = "file:" + path + "?_pragma=busy_timeout(1000)"
			}
			s := sqltest.StoreOnDB(t, sqltest.OpenDB(t, driver, dsn), sqlstore.SQLite, "dedup_test")
			testkit.RefusedCalls(t, s, 2, "unable to open database file", false)
			if ran, err := testkit.FailOpenRun(t, s, 3); ran != 0 || err == nil {
				t.Fatalf("FailOpen on a database SQLite cannot open: %d of 3 handlers ran unprotected, last error %v", ran, err)
			}
		})
	}
}
