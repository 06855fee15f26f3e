package sqlstore_test

import (
	"io"
	"log"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
)

func init() {
	// The connection-cut test breaks connections on purpose; keep the
	// driver's own log quiet.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}

// backends are the servers the package's tests run on: PostgreSQL and
// MySQL/MariaDB. The SQLite runs are internal/onstores/sqlstore's, which
// keeps the SQLite drivers out of this library package's tests; the tests
// that need this package's hooks (export_test.go: group commit's, TestPurge)
// run on the servers only.
var backends = sqltest.Servers
