// Package sqltest starts PostgreSQL clusters of a test's own, makes
// least-privileged SQL roles, opens the test databases and drops the
// tables a test made. It imports pgx, go-sql-driver/mysql and testkit
// only: no SQLite driver.
package sqltest
