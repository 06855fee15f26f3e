package redisstore

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// Value layout. A record is one Redis string:
//
//	processing  'p' ‖ token (tokenLen bytes) ‖ lease in ms (decimal)   PX 2×lease
//	            [‖ ':' ‖ owner]  (ClaimOwned; Extend keeps it)
//	done        "1"                  (no data)                          PX retention
//	done        'd' ‖ data                                              PX retention
//	done        'D' ‖ by (byLen bytes) ‖ data                           PX retention
//
// The lease is valid while PTTL > lease, so an expired processing record
// survives one more lease length and a takeover soon after expiry is seen as
// one. "1" is one of Redis's shared integer objects: a done record without
// data costs no value allocation at all (unless maxmemory-policy is an
// LRU/LFU one, which disables shared integers — and which must not be used
// anyway, see README).
//
// The 'D' form is written by a Complete of a claim whose keys live on
// several nodes (see fencedSharded): by, completedBy of the claim, lets a
// retry of a Complete cut part-way tell the keys it completed from keys
// done by another claim, and complete the rest.
const (
	tokenLen     = 26 // len(rand.Text())
	doneNoData   = "1"
	doneDataTag  = 'd'
	doneByTag    = 'D'
	processingID = 'p'
	byLen        = 8
	ownerTag     = ':'
)

// completedBy is what a 'D' done record keeps of the Complete that wrote
// it: the first byLen bytes of SHA-256 of the claim's token and its
// record keys, in the claim's order.
func completedBy(token string, rkeys []string) string {
	h := sha256.New()
	h.Write([]byte(token))
	for _, k := range rkeys {
		h.Write([]byte{0})
		h.Write([]byte(k))
	}
	return string(h.Sum(nil)[:byLen])
}

// doneValue is the value Complete stores.
func doneValue(data []byte) string {
	if len(data) == 0 {
		return doneNoData
	}
	b := make([]byte, 1+len(data))
	b[0] = doneDataTag
	copy(b[1:], data)
	return string(b)
}

// processingValue is the value Claim and Extend store; suffix is
// ownerSuffix's (Extend's script keeps the record's own).
func processingValue(token string, leaseMS int64, suffix string) string {
	b := make([]byte, 0, 1+len(token)+20+len(suffix))
	b = append(b, processingID)
	b = append(b, token...)
	b = strconv.AppendInt(b, leaseMS, 10)
	return bytesToString(append(b, suffix...))
}

// ownerSuffix is what a processing value keeps of owner after its lease:
// nothing for none.
func ownerSuffix(owner []byte) string {
	if len(owner) == 0 {
		return ""
	}
	return string(ownerTag) + string(owner)
}

// ownerOf returns the owner a processing value v keeps, nil for none
// (or a value that is not a processing record).
func ownerOf(v string) []byte {
	if len(v) <= 1+tokenLen || v[0] != processingID {
		return nil
	}
	i := strings.IndexByte(v[1+tokenLen:], ownerTag)
	if i < 0 || 1+tokenLen+i+1 == len(v) {
		return nil
	}
	return []byte(v[1+tokenLen+i+1:])
}

// bytesToString returns b as a string without copying it; b must not be
// changed afterwards.
func bytesToString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// record is a decoded value.
type record struct {
	processing bool
	token      string // processing only
	data       []byte // done only
	by         string // done in the 'D' form only: completedBy
}

// decodeValue decodes a value written by this package. Anything else under
// the store's prefix is an error, never a guess: a wrong guess would ack a
// message or run a handler twice.
func decodeValue(v string) (record, error) {
	switch {
	case v == doneNoData:
		return record{}, nil
	case len(v) > 0 && v[0] == doneDataTag:
		return record{data: []byte(v[1:])}, nil
	case len(v) > byLen && v[0] == doneByTag:
		rec := record{by: v[1 : 1+byLen]}
		if len(v) > 1+byLen {
			rec.data = []byte(v[1+byLen:])
		}
		return rec, nil
	case len(v) > 1+tokenLen && v[0] == processingID:
		return record{processing: true, token: v[1 : 1+tokenLen]}, nil
	default:
		n := min(len(v), 16)
		return record{}, fmt.Errorf("redisstore: a key under the store's prefix holds a value this store did not write (%q…)", v[:n])
	}
}

// leaseMS returns the lease, in milliseconds, of a processing value.
func leaseMS(v string) (int64, error) {
	l := v[1+tokenLen:]
	if i := strings.IndexByte(l, ownerTag); i >= 0 {
		l = l[:i]
	}
	n, err := strconv.ParseInt(l, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("redisstore: a processing record with a malformed lease (%q…)", v[:min(len(v), 16)])
	}
	return n, nil
}

// ms converts d to whole milliseconds, rounding up so that a positive
// duration never becomes 0 (PX 0 is an error). It cannot overflow: the
// longest duration, math.MaxInt64 (about 292 years), is 9.2e12 ms, and
// twice that, the PX of a processing record, is still exact in a Lua
// number (a double) and far below the server's limit.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}
