package sqlstore

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
)

// Records' ids and claims' tokens: the digest of (scope, key) that keys
// the table, and the ids of one call in lock order. How a dialect takes
// them as arguments is in records.go.

// RecordID returns the primary key of (scope, key): the first 16 bytes of
// SHA-256 over a length-prefixed encoding of both, so no two pairs share an
// encoding. On PostgreSQL the id column shows it as a uuid. Use it to find
// a key's record by hand.
//
// A 128-bit digest keeps rows small and index entries fixed-size whatever
// the key length. Two distinct pairs collide with probability about
// n²/2^129 for n live records (below 10^-14 for a trillion records); a
// collision would make one key a false duplicate of the other.
func RecordID(scope, key string) [16]byte {
	return digest(scope, key)
}

func digest(scope, key string) recordID {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("watermill-dedup/sqlstore/v1\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	var id recordID
	copy(id[:], h.Sum(nil))
	return id
}

// recordID is the 128-bit digest of (scope, key) that keys the table.
type recordID [16]byte

func (id recordID) uuid() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// keySet is the keys of one operation as record ids: ids is sorted and
// without repeats (lock order, so concurrent multi-key operations cannot
// deadlock), order maps each key, in the caller's order, to its id.
type keySet struct {
	ids   []recordID
	order []recordID
}

func newKeySet(scope string, keys []string) keySet {
	ks := keySet{order: make([]recordID, len(keys))}
	for i, k := range keys {
		ks.order[i] = digest(scope, k)
	}
	ks.ids = slices.Clone(ks.order)
	slices.SortFunc(ks.ids, func(a, b recordID) int { return bytes.Compare(a[:], b[:]) })
	ks.ids = slices.Compact(ks.ids)
	return ks
}

// newToken returns a random positive 63-bit fencing token.
func newToken() int64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	t := int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	if t == 0 {
		t = 1
	}
	return t
}
