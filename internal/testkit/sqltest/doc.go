// Package sqltest starts PostgreSQL clusters of a test's own, makes
// least-privileged SQL roles, opens the test databases and drops the
// tables a test made. It also holds what the tests of stores/sqlstore
// and internal/onstores/sqlstore share: the backends, stores on a table
// of their own, the ledger of the transactional tests, the Inbox fixture
// and the suites both run (Conformance, InboxConformance, Model). It
// imports pgx, go-sql-driver/mysql, testkit and the module's own packages
// only: no SQLite driver, no watermill-sql.
package sqltest
