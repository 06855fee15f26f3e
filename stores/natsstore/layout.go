package natsstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// This file is the single place that knows how records are laid out in
// the bucket: the KV key of a (scope, key) pair, the subject it is
// written under and the bytes of its value.

// Key layout: one KV key per (scope, key), the URL-safe base64 (no
// padding) of the first 16 bytes of
//
//	SHA-256("watermill-dedup/natsstore/v1" ‖ 0x00 ‖ uvarint(len(scope)) ‖ scope ‖ key)
//
// 22 characters of [A-Za-z0-9_-], all of which NATS allows in a KV key
// (and none of which is the token separator '.'), whatever bytes, and
// however many, the scope and the key hold. The length prefix makes the
// hashed input injective in (scope, key): ("a:", "b") and ("a", ":b")
// hash different inputs. Two pairs share a record only if SHA-256
// collides on its first 128 bits: about n²/2¹²⁹ for n live records.
const (
	digestLen = 16
	// KeyLen is the length of every KV key the store writes.
	KeyLen = 22
)

// digestDomain separates this store's digests from any other use of
// SHA-256 on the same bytes.
const digestDomain = "watermill-dedup/natsstore/v1\x00"

// digest returns the first 16 bytes of the SHA-256 above.
func digest(scope, key string) [digestLen]byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte(digestDomain))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return [digestLen]byte(h.Sum(sum[:0]))
}

// encodeKey returns the KV key of a digest.
func encodeKey(d [digestLen]byte) string { return base64.RawURLEncoding.EncodeToString(d[:]) }

// recordKey returns the KV key of (scope, key).
func recordKey(scope, key string) string { return encodeKey(digest(scope, key)) }

// shardOf returns the shard, of n, of a digest: its last 8 bytes modulo
// n (uniform to within n/2⁶⁴).
func shardOf(d [digestLen]byte, n int) int {
	return int(binary.BigEndian.Uint64(d[digestLen-8:]) % uint64(n))
}

// streamName is the JetStream stream behind bucket, as the KV API names
// it.
func streamName(bucket string) string { return "KV_" + bucket }

// subjectPrefix is what a key of bucket is written under: the subject of
// key is subjectPrefix(bucket) + key.
func subjectPrefix(bucket string) string { return "$KV." + bucket + "." }

// Value layout (the message body of the key's latest revision):
//
//	processing: 'p' ‖ lease_until (int64, big endian, Unix ns) ‖ token
//	            [‖ 0x00 ‖ owner]  (ClaimOwned; Extend keeps it)
//	done:       'D' ‖ expires_at  (int64, big endian, Unix ns) ‖ by (8 bytes) ‖ data
//
// where by is the first 8 bytes of SHA-256 of the token and the keys of
// the claim that completed the record (completedBy): a Complete cut between the keys of its claim
// (one written, the connection lost before the next) tells its own done
// keys from others' when it is retried, and completes the rest. A done
// value tagged 'd' (no by) is read too.
//
// A revision that is a KV delete or purge marker (header KV-Operation)
// is no record. A token never holds a 0 byte (newToken); a version of
// this store that knows no owners reads an owned processing record as
// another claim's, which it is. Times are the store's Clock, to the nanosecond; a
// record's state is decided from them, not from the message's age.
const (
	tagProcessing = 'p'
	tagDone       = 'D'
	tagDoneNoBy   = 'd'
	valueHeadLen  = 9
	byLen         = 8
	ownerSep      = 0
)

// errForeign reports a value the store did not write.
var errForeign = errors.New("natsstore: the bucket holds a value this store did not write")

type state uint8

const (
	stateNone state = iota
	stateProcessing
	stateDone
)

// entry is what a read found under one key.
type entry struct {
	rev   uint64 // revision of the key's last message; 0 when it has none
	state state
	at    int64       // lease_until or expires_at, Unix ns
	token string      // processing
	owner []byte      // processing: its claim's owner (stores.OwnerClaimer), nil for none
	data  []byte      // done
	by    [byLen]byte // done: completedBy of the claim's token (zero when unknown)
	raw   []byte      // the value as read (to put a record back exactly)
}

func appendHead(b []byte, tag byte, at int64) []byte {
	b = append(b, tag)
	return binary.BigEndian.AppendUint64(b, uint64(at))
}

func processingValue(until int64, token string, owner []byte) []byte {
	b := append(appendHead(make([]byte, 0, valueHeadLen+len(token)+1+len(owner)), tagProcessing, until), token...)
	if len(owner) == 0 {
		return b
	}
	return append(append(b, ownerSep), owner...)
}

func doneValue(expires int64, by [byLen]byte, data []byte) []byte {
	b := appendHead(make([]byte, 0, valueHeadLen+byLen+len(data)), tagDone, expires)
	b = append(b, by[:]...)
	return append(b, data...)
}

// completedBy is what a done record keeps of the Complete that wrote it:
// the claim's token and the subjects of all its keys, in write order. A
// retried Complete of the same claim recognises its own done keys by it;
// anything else that shares the token but not the keys (a claim value
// altered to name fewer keys) does not.
func completedBy(token string, subjects []string) [byLen]byte {
	h := sha256.New()
	h.Write([]byte(token))
	for _, s := range subjects {
		h.Write([]byte{0})
		h.Write([]byte(s))
	}
	return [byLen]byte(h.Sum(nil)[:byLen])
}

// decodeValue fills e from the value of a put revision.
func decodeValue(e *entry, v []byte) error {
	if len(v) < valueHeadLen || (v[0] == tagDone && len(v) < valueHeadLen+byLen) ||
		(v[0] != tagProcessing && v[0] != tagDone && v[0] != tagDoneNoBy) {
		return fmt.Errorf("%w (%d bytes)", errForeign, len(v))
	}
	e.raw = v
	e.at = int64(binary.BigEndian.Uint64(v[1:valueHeadLen]))
	rest := v[valueHeadLen:]
	switch v[0] {
	case tagProcessing:
		token, owner, found := bytes.Cut(rest, []byte{ownerSep})
		e.state, e.token = stateProcessing, string(token)
		if found && len(owner) > 0 {
			e.owner = owner
		}
		return nil
	case tagDone:
		e.by = [byLen]byte(rest[:byLen])
		rest = rest[byLen:]
	}
	e.state = stateDone
	if len(rest) > 0 {
		e.data = rest
	}
	return nil
}

// addNanos returns t+d for Unix nanoseconds, capped at math.MaxInt64.
func addNanos(t int64, d time.Duration) int64 {
	if d > 0 && t > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return t + int64(d)
}
