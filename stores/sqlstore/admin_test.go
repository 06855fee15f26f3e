package sqlstore_test

import (
	"context"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestAdminRecordID: the ID the admin interface reports is RecordID as a
// UUID, the id column of the table; a List cursor takes it with or
// without dashes; and every dialect reports the table's size.
func TestAdminRecordID(t *testing.T) {
	forEachBackend(t, backends, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newStore(t, b.open(t), b.dialect, sqlstore.Config{})
		c, err := s.Claim(ctx, "orders", []string{"k"}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		r, err := s.Get(ctx, "orders", "k")
		if err != nil {
			t.Fatal(err)
		}
		id := sqlstore.RecordID("orders", "k")
		h := hex.EncodeToString(id[:])
		if want := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]; r.ID != want {
			t.Fatalf("ID = %q, want RecordID %q", r.ID, want)
		}
		for _, after := range []string{r.ID, h} {
			recs, next, err := s.List(ctx, stores.ListOptions{After: after})
			if err != nil || len(recs) != 0 || next != "" {
				t.Fatalf("List after the only record (%q) = %+v, %q, %v", after, recs, next, err)
			}
		}
		_, _, err = s.List(ctx, stores.ListOptions{Scope: "orders"})
		if !errors.Is(err, stores.ErrNotSupported) {
			t.Fatalf("List by scope = %v, want ErrNotSupported", err)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Processing != 1 || st.Bytes <= 0 {
			t.Fatalf("Stats = %+v, want one processing record and the table's size", st)
		}
	})
}
