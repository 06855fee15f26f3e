package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
)

// TestMaxKeyWithDigests: with DigestKeysLongerThan at or below
// MaxKeyLen, every key is accepted (Capabilities states no MaxKey): a
// key up to the digest bound verbatim, a longer one as a digest.
func TestMaxKeyWithDigests(t *testing.T) {
	s := newStore(t, sharedRedis(t), redisstore.Config{MaxKeyLen: 64, DigestKeysLongerThan: 64})
	if c := s.Capabilities(); c.MaxKey != 0 || c.MaxScope != 64 {
		t.Fatalf("Capabilities = %+v, want MaxKey 0 (digests), MaxScope 64", c)
	}
	ctx := context.Background()
	for _, n := range []int{64, 65, 4096} {
		c, err := s.Claim(ctx, "s", []string{string(bytes.Repeat([]byte{'k'}, n))}, time.Minute)
		if err != nil || c.Result != stores.Claimed {
			t.Fatalf("Claim of a %d-byte key = %v, %v", n, c, err)
		}
	}
}

// TestDataLimit: Redis refuses an argument longer than its
// proto-max-bulk-len (here its least, 1 MiB), and closes the connection.
// A store whose MaxData fits keeps exactly MaxData; one whose MaxData
// does not gets the server's refusal as stores.ErrTooLarge, never as an
// outage, the claim still processing; and once CheckServer has read the
// setting, such data is refused before any I/O.
func TestDataLimit(t *testing.T) {
	const bulk = 1 << 20
	addr := startRedis(t, "--proto-max-bulk-len", "1mb")
	ctx := context.Background()

	t.Run("fits", func(t *testing.T) {
		s := newStore(t, newClient(t, addr), redisstore.Config{MaxData: bulk - 1})
		if err := s.CheckServer(ctx); err != nil {
			t.Fatalf("CheckServer with MaxData below proto-max-bulk-len: %v", err)
		}
		data := bytes.Repeat([]byte{0xa5}, bulk-1)
		c := claimOK(t, s, "fits")
		errtest.Wraps(t, "Complete with MaxData+1 bytes", s.Complete(ctx, c, time.Hour, append(data, 0)), stores.ErrTooLarge)
		if err := s.Complete(ctx, c, time.Hour, data); err != nil {
			t.Fatalf("Complete with MaxData bytes: %v", err)
		}
		if d, err := s.Claim(ctx, "s", []string{"fits"}, time.Minute); err != nil || d.Result != stores.Duplicate || !bytes.Equal(d.Data, data) {
			t.Fatalf("Claim after Complete = %v with %d bytes, %v", d.Result, len(d.Data), err)
		}
	})

	for _, batched := range []bool{true, false} {
		name := "unbatched"
		if batched {
			name = "batched"
		}
		t.Run("refused by the server, "+name, func(t *testing.T) {
			s := newStore(t, newClient(t, addr), redisstore.Config{Batch: redisstore.BatchConfig{Disabled: !batched}})
			if got := s.Capabilities().MaxData; got != redisstore.DefaultMaxData {
				t.Fatalf("MaxData = %d, want DefaultMaxData", got)
			}
			c := claimOK(t, s, "big")
			err := s.Complete(ctx, c, time.Hour, make([]byte, 2*bulk))
			errtest.NotOutage(t, "Complete with more data than proto-max-bulk-len", err, stores.ErrTooLarge)
			if d, err := s.Claim(ctx, "s", []string{"big"}, time.Minute); err != nil || d.Result != stores.InProgress {
				t.Fatalf("Claim after the refused Complete = %v, %v; want in_progress", d, err)
			}
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatalf("Complete without data after ErrTooLarge: %v", err)
			}
		})
	}

	t.Run("CheckServer", func(t *testing.T) {
		log := watermill.NewCaptureLogger()
		s := newStore(t, newClient(t, addr), redisstore.Config{Logger: log})
		err := s.CheckServer(ctx)
		if !errors.Is(err, redisstore.ErrDataLimit) {
			t.Fatalf("CheckServer with the default MaxData on a 1mb server: %v, want ErrDataLimit", err)
		}
		if logged := log.Captured()[watermill.ErrorLogLevel]; len(logged) != 1 || !errors.Is(logged[0].Err, redisstore.ErrDataLimit) {
			t.Fatalf("CheckServer logged %v, want one error wrapping ErrDataLimit", logged)
		}
		c := claimOK(t, s, "checked")
		// Refused before any I/O now: the connection stays up.
		errtest.Wraps(t, "Complete with more data than the server takes", s.Complete(ctx, c, time.Hour, make([]byte, bulk)), stores.ErrTooLarge)
		if err := s.Complete(ctx, c, time.Hour, make([]byte, bulk-1)); err != nil {
			t.Fatalf("Complete with as much data as the server takes: %v", err)
		}
	})
}

func claimOK(t *testing.T, s stores.Store, key string) *stores.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), "s", []string{key}, time.Minute)
	if err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim(%q) = %v, %v", key, c, err)
	}
	return c
}
