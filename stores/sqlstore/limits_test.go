package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// TestMySQLMaxData: on MariaDB's default max_allowed_packet (16 MiB),
// with go-sql-driver's default maxAllowedPacket, data of exactly MaxData
// bytes is kept whole: MEDIUMBLOB's 16 MiB - 1 did not get through (error
// 1153: the statement did not fit the packet). A session with a
// non-strict sql_mode, which would cut a value longer than the column
// without an error, never gets one: one byte more is refused before any
// I/O.
func TestMySQLMaxData(t *testing.T) {
	for _, mode := range []string{"", "'STRICT_ALL_TABLES'"} {
		t.Run("sql_mode="+mode, func(t *testing.T) {
			params := map[string]string{}
			if mode != "" {
				params["sql_mode"] = mode
			} else {
				params["sql_mode"] = "''"
			}
			db := mysqlWith(t, params)
			for _, batched := range []bool{true, false} {
				s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{Batch: sqlstore.BatchConfig{Disabled: !batched}})
				max := s.Capabilities().MaxData
				if max != sqlstore.MaxDataMySQL {
					t.Fatalf("MaxData = %d, want MaxDataMySQL", max)
				}
				sqltest.MaxDataRoundTrip(t, s, "max", max)
				c, err := s.Claim(context.Background(), "s", []string{"over"}, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				errtest.NotOutage(t, "Complete with MaxData+1 bytes", s.Complete(context.Background(), c, time.Hour, make([]byte, max+1)), stores.ErrTooLarge)
			}
		})
	}
}

// TestMySQLPacketLimit: on a server whose max_allowed_packet is below
// what MaxData needs, the store finds it at its first call, logs it, and
// refuses data over it before any I/O (the server would refuse the
// statement with 1153 and close the connection: a Commit of an inbox
// transaction would lose the transaction); as much as it takes is kept.
// Two batched Completes whose data together exceed the packet succeed:
// the batch fails as a whole and each runs on its own.
func TestMySQLPacketLimit(t *testing.T) {
	srv := startMariaDB(t, "--max-allowed-packet=1M")
	db := srv.open(t, "test")
	log := watermill.NewCaptureLogger()
	s := sqltest.NewStore(t, db, sqlstore.MySQL, sqlstore.Config{Logger: log})
	ctx := context.Background()
	const limit = 1<<20 - 1<<10
	c, err := s.Claim(ctx, "s", []string{"big"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if logged := log.Captured()[watermill.ErrorLogLevel]; len(logged) != 1 || !errors.Is(logged[0].Err, stores.ErrTooLarge) {
		t.Fatalf("the first call logged %v, want one error about the packet", logged)
	}
	errtest.NotOutage(t, "Complete with more data than the packet carries", s.Complete(ctx, c, time.Hour, make([]byte, limit+1)), stores.ErrTooLarge)
	if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
		t.Fatalf("Complete without data after ErrTooLarge: %v", err)
	}
	sqltest.MaxDataRoundTrip(t, s, "limit", limit)

	tx, err := s.Begin(ctx, "s", []string{"inbox"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	errtest.NotOutage(t, "InboxTx.Commit with more data than the packet carries", tx.Commit(ctx, make([]byte, limit+1)), stores.ErrTooLarge)
	if err := tx.Commit(ctx, make([]byte, limit)); err != nil {
		t.Fatalf("InboxTx.Commit with as much data as the packet carries, after ErrTooLarge: %v", err)
	}

	// Concurrent Completes of 700 KB each: a batch of two would not fit.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := string(rune('a' + i))
			c, err := s.Claim(ctx, "batch", []string{key}, time.Hour)
			if err == nil {
				err = s.Complete(ctx, c, time.Hour, make([]byte, 700<<10))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Complete of 700 KB: %v", err)
		}
	}
}
