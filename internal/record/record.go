// Package record is the format of the data a done dedup record keeps
// (stores.Claim.Data): the payload fingerprint and the messages the
// handler produced (the publisher keeps none), so that a redelivery after
// a failed publish re-emits them. They keep their UUIDs, so downstream
// dedup by message id makes them once. A record with neither keeps no
// data at all. The claim cycle writes and reads it; dedupctl shows it.
//
//	version byte (1, or 2 with the time)
//	version 2 only: uvarint Unix milliseconds the record was completed at
//	uvarint len(fingerprint), fingerprint
//	uvarint number of messages, then per message:
//	  string uuid, uvarint number of metadata pairs,
//	  (string key, string value)..., bytes payload
//
// where string and bytes are a uvarint length and the bytes. The time is
// kept only when tracing wants it (dedup.record.age on a duplicate's
// span): it costs a few bytes on every record.
package record

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
)

// The format's versions.
const (
	dataVersion     = 1
	dataVersionTime = 2
)

// Encode is the data a done record keeps for fingerprint and msgs.
func Encode(fingerprint []byte, msgs []*message.Message) []byte {
	return EncodeAt(fingerprint, msgs, time.Time{})
}

// EncodeAt is Encode with the time the record is completed at
// (none when at is zero).
func EncodeAt(fingerprint []byte, msgs []*message.Message, at time.Time) []byte {
	if len(fingerprint) == 0 && len(msgs) == 0 && at.IsZero() {
		return nil
	}
	size := 1 + binary.MaxVarintLen64*3 + len(fingerprint)
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	if at.IsZero() {
		b = append(b, dataVersion)
	} else {
		b = append(b, dataVersionTime)
		b = binary.AppendUvarint(b, uint64(max(at.UnixMilli(), 0)))
	}
	b = appendBytes(b, fingerprint)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = appendBytes(b, []byte(m.UUID))
		keys := make([]string, 0, len(m.Metadata))
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = appendBytes(b, []byte(k))
			b = appendBytes(b, []byte(m.Metadata[k]))
		}
		b = appendBytes(b, m.Payload)
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

type decoder struct {
	b   []byte
	at  uint64 // version 2's time
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad length", dedup.ErrCorruptRecord)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: field of %d bytes in %d", dedup.ErrCorruptRecord, n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// newDecoder reads the version (and the time of version 2) of data, which
// is not empty.
func newDecoder(data []byte) (*decoder, error) {
	d := &decoder{b: data[1:]}
	switch data[0] {
	case dataVersion:
	case dataVersionTime:
		d.at = d.uvarint()
	default:
		return nil, fmt.Errorf("%w: unknown version %d", dedup.ErrCorruptRecord, data[0])
	}
	return d, d.err
}

// DoneAt returns the time data says its record was completed at, and
// false when it does not say (or is not data of ours).
func DoneAt(data []byte) (time.Time, bool) {
	if len(data) == 0 || data[0] != dataVersionTime {
		return time.Time{}, false
	}
	d, err := newDecoder(data)
	if err != nil || d.at > math.MaxInt64 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(d.at)), true
}

// Decode is the inverse of Encode. Empty data decodes to
// nothing; data it did not write fails with dedup.ErrCorruptRecord.
func Decode(data []byte) (fingerprint []byte, msgs []*message.Message, err error) {
	if len(data) == 0 {
		return nil, nil, nil
	}
	d, err := newDecoder(data)
	if err != nil {
		return nil, nil, err
	}
	fingerprint = d.bytes()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		return nil, nil, fmt.Errorf("%w: %d messages in %d bytes", dedup.ErrCorruptRecord, n, len(d.b))
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		uuid := string(d.bytes())
		pairs := d.uvarint()
		if d.err == nil && pairs > uint64(len(d.b)) {
			return nil, nil, fmt.Errorf("%w: %d metadata pairs in %d bytes", dedup.ErrCorruptRecord, pairs, len(d.b))
		}
		md := make(message.Metadata, pairs)
		for j := uint64(0); j < pairs && d.err == nil; j++ {
			k := string(d.bytes())
			md[k] = string(d.bytes())
		}
		payload := d.bytes()
		if d.err != nil {
			break
		}
		m := message.NewMessage(uuid, slices.Clone(payload))
		m.Metadata = md
		msgs = append(msgs, m)
	}
	if d.err != nil {
		return nil, nil, d.err
	}
	if len(d.b) != 0 {
		return nil, nil, fmt.Errorf("%w: %d trailing bytes", dedup.ErrCorruptRecord, len(d.b))
	}
	return slices.Clone(fingerprint), msgs, nil
}

// Info describes the data the middleware keeps on a done record
// (stores.Claim.Data, stores.Record.Data): the payload fingerprint, when
// the middleware's Config.Fingerprint was set, and the messages the handler produced, which
// a redelivery re-emits.
type Info struct {
	// Fingerprint is the payload fingerprint kept with the record, nil
	// when none was.
	Fingerprint []byte
	// Outputs is the number of produced messages kept with the record.
	Outputs int
}

// FingerprintHex is the fingerprint in hexadecimal, "" when there is none.
func (i Info) FingerprintHex() string { return hex.EncodeToString(i.Fingerprint) }

// Inspect decodes the data of a done record written by the
// middleware, for tools that show records to people (dedupctl). Empty
// data (a record without fingerprint or outputs) is the zero
// Info. Data the middleware did not write fails with an error
// wrapping dedup.ErrCorruptRecord.
func Inspect(data []byte) (Info, error) {
	fp, msgs, err := Decode(data)
	if err != nil {
		return Info{}, err
	}
	return Info{Fingerprint: fp, Outputs: len(msgs)}, nil
}
