// Package record is the format of the data a done dedup record keeps
// (stores.Claim.Data): the payload fingerprint and the messages the
// handler produced (the publisher keeps none), so that a redelivery after
// a failed publish re-emits them. They keep their UUIDs, so downstream
// dedup by message id makes them once. A record with neither keeps no
// data at all. The claim cycle writes and reads it; dedupctl shows it.
//
//	version byte (1; 2 with the time; 3 with the time and the run)
//	versions 2 and 3: uvarint Unix milliseconds the record was completed at
//	version 3 only: the run's trace context, 25 bytes (RunSize): trace id
//	  (16), span id (8), trace flags (1)
//	uvarint len(fingerprint), fingerprint
//	uvarint number of messages, then per message:
//	  string uuid, uvarint number of metadata pairs,
//	  (string key, string value)..., bytes payload
//
// where string and bytes are a uvarint length and the bytes. The time is
// kept only when tracing wants it (dedup.record.age on a duplicate's
// span): it costs a few bytes on every record. The run is kept only when
// tracing links runs (dedup.Tracing.LinkRuns): the span context of the
// message's span in the run that completed the record, which a
// duplicate's span links to. It costs RunSize (25) bytes more.
//
// The same 25 bytes are the owner a claim keeps on its processing records
// (stores.OwnerClaimer) when tracing links runs: AppendRun, ParseRun.
package record

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
)

// The format's versions.
const (
	dataVersion     = 1
	dataVersionTime = 2
	dataVersionRun  = 3
)

// RunSize is the size of a run's trace context, in a version 3 record
// and in a claim's owner: trace id, span id and trace flags.
const RunSize = 16 + 8 + 1

// AppendRun appends sc's RunSize bytes to b, or nothing when sc is not
// valid.
func AppendRun(b []byte, sc trace.SpanContext) []byte {
	if !sc.IsValid() {
		return b
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	b = append(b, tid[:]...)
	b = append(b, sid[:]...)
	return append(b, byte(sc.TraceFlags()))
}

// ParseRun reads the span context of b, RunSize bytes written by
// AppendRun; false for anything else. The span context is remote: it is
// another process's, or another run's.
func ParseRun(b []byte) (trace.SpanContext, bool) {
	if len(b) != RunSize {
		return trace.SpanContext{}, false
	}
	var cfg trace.SpanContextConfig
	copy(cfg.TraceID[:], b[:16])
	copy(cfg.SpanID[:], b[16:24])
	cfg.TraceFlags = trace.TraceFlags(b[24])
	cfg.Remote = true
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// Encode is the data a done record keeps for fingerprint and msgs.
func Encode(fingerprint []byte, msgs []*message.Message) []byte {
	return EncodeAt(fingerprint, msgs, time.Time{})
}

// EncodeAt is Encode with the time the record is completed at
// (none when at is zero).
func EncodeAt(fingerprint []byte, msgs []*message.Message, at time.Time) []byte {
	return EncodeRun(fingerprint, msgs, at, trace.SpanContext{})
}

// EncodeRun is EncodeAt with the span context of the run that completes
// the record (version 3), when run is valid and at is not zero.
func EncodeRun(fingerprint []byte, msgs []*message.Message, at time.Time, run trace.SpanContext) []byte {
	if len(fingerprint) == 0 && len(msgs) == 0 && at.IsZero() {
		return nil
	}
	size := 1 + RunSize + binary.MaxVarintLen64*3 + len(fingerprint)
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	switch {
	case at.IsZero():
		b = append(b, dataVersion)
	case run.IsValid():
		b = append(b, dataVersionRun)
		b = binary.AppendUvarint(b, uint64(max(at.UnixMilli(), 0)))
		b = AppendRun(b, run)
	default:
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
	at  uint64 // version 2's and 3's time
	run []byte // version 3's run
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

// newDecoder reads the version (and the time and run of versions 2
// and 3) of data, which is not empty.
func newDecoder(data []byte) (*decoder, error) {
	d := &decoder{b: data[1:]}
	switch data[0] {
	case dataVersion:
	case dataVersionTime:
		d.at = d.uvarint()
	case dataVersionRun:
		d.at = d.uvarint()
		if d.err == nil && len(d.b) < RunSize {
			d.err = fmt.Errorf("%w: run of %d bytes", dedup.ErrCorruptRecord, len(d.b))
		}
		if d.err == nil {
			d.run, d.b = d.b[:RunSize:RunSize], d.b[RunSize:]
		}
	default:
		return nil, fmt.Errorf("%w: unknown version %d", dedup.ErrCorruptRecord, data[0])
	}
	return d, d.err
}

// DoneAt returns the time data says its record was completed at, and
// false when it does not say (or is not data of ours).
func DoneAt(data []byte) (time.Time, bool) {
	if len(data) == 0 || (data[0] != dataVersionTime && data[0] != dataVersionRun) {
		return time.Time{}, false
	}
	d, err := newDecoder(data)
	if err != nil || d.at > math.MaxInt64 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(d.at)), true
}

// RunOf returns the span context of the run that completed data's
// record, and false when data keeps none (or is not data of ours).
func RunOf(data []byte) (trace.SpanContext, bool) {
	if len(data) == 0 || data[0] != dataVersionRun {
		return trace.SpanContext{}, false
	}
	d, err := newDecoder(data)
	if err != nil {
		return trace.SpanContext{}, false
	}
	return ParseRun(d.run)
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
	// Run is the span context of the message's span in the run that
	// completed the record, when tracing linked runs (not valid
	// otherwise).
	Run trace.SpanContext
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
	run, _ := RunOf(data)
	return Info{Fingerprint: fp, Outputs: len(msgs), Run: run}, nil
}
