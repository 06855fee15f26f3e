package sqlstore

import (
	"fmt"
	"strings"
	"testing"
)

// The MySQL multi-row claim INSERT lists one row of placeholders per
// claim, comma-separated, with nothing before the first or after the last
// (a stray comma is a syntax error that sends every batched claim down the
// one-by-one path).
func TestInsertProcessingRows(t *testing.T) {
	d := newMySQL("dedup")
	row := fmt.Sprintf("(?, %d, ?, ?)", stateProcessing)
	for _, n := range []int{1, 2, 5} {
		rows := strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
		want := "INSERT INTO " + d.q.table + " (id, state, token, expires_at) VALUES " + rows + mysqlOnConflict
		if got := d.insertProcessingRows(n); got != want {
			t.Errorf("insertProcessingRows(%d) =\n%s\nwant\n%s", n, got, want)
		}
	}
}
