// Package sqlstore holds sqlstore's tests on SQLite and with watermill-sql
// (v3 and v4): the tests that need a SQLite driver (modernc.org/sqlite,
// github.com/mattn/go-sqlite3) or watermill-sql, kept out of
// stores/sqlstore so that a program importing the store does not download
// them for its tests. It has no code of its own. The group commit's and
// the purge's tests, which sqlstore's own run on PostgreSQL and MySQL
// through the package's hooks, run here on SQLite through
// mattn/go-sqlite3's authorizer instead (sqliteHooks): it holds a
// statement, fails it, or counts it.
package sqlstore
