package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// UniqueName returns prefix followed by 10 random hex digits: a table or
// key name no other test or run uses.
func UniqueName(prefix string) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// Memstore is a memstore on clock (nil: the system clock), closed when t
// ends.
func Memstore(t testing.TB, clock stores.Clock) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}
