package sqlstore_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestLockingReadsSortBeforeTheyLock: on PostgreSQL every read that locks
// several records sorts them by id before it locks them (LockRows above a
// Sort in the plan): the order in which a multi-key claim or Begin and the
// sorted batches lock. Without the sort PostgreSQL locks in heap order,
// and a fenced Release, Complete or Extend of a multi-key claim deadlocked
// with a multi-key claim or Begin of the same keys whenever the records
// lay in the heap out of id order (after a takeover, say), each cycle
// broken only after deadlock_timeout (TestFencedCallsBesideClaims).
func TestLockingReadsSortBeforeTheyLock(t *testing.T) {
	db := openPostgres(t)
	s := newStore(t, db, sqlstore.Postgres, sqlstore.Config{})
	for name, q := range sqlstore.LockingReads(s) {
		plan := explain(t, db, q.Stmt, q.Args)
		lock, sort := strings.Index(plan, "LockRows"), strings.Index(plan, "Sort")
		if lock < 0 || sort < lock {
			t.Errorf("%s: the plan does not sort below its LockRows:\n%s", name, plan)
		}
	}
}

func explain(t *testing.T, db *sql.DB, stmt string, args []any) string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", stmt, err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
