package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
)

func TestDataRoundTrip(t *testing.T) {
	if Encode(nil, nil) != nil {
		t.Fatal("no fingerprint and no outputs must store nothing")
	}
	a := message.NewMessage("out-1", []byte{0, 1, 2, 0xff})
	a.Metadata.Set("k", "v")
	a.Metadata.Set("empty", "")
	b := message.NewMessage("out-2", nil)
	data := Encode([]byte("fp"), []*message.Message{a, b})
	fp, msgs, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if string(fp) != "fp" || len(msgs) != 2 {
		t.Fatalf("decoded fp %q and %d messages", fp, len(msgs))
	}
	for i, want := range []*message.Message{a, b} {
		got := msgs[i]
		if got.UUID != want.UUID || !bytes.Equal(got.Payload, want.Payload) || len(got.Metadata) != len(want.Metadata) {
			t.Fatalf("message %d: got %+v, want %+v", i, got, want)
		}
		for k, v := range want.Metadata {
			if got.Metadata[k] != v {
				t.Fatalf("message %d metadata %q = %q, want %q", i, k, got.Metadata[k], v)
			}
		}
	}
	// Deterministic: metadata order does not change the bytes.
	if !bytes.Equal(data, Encode([]byte("fp"), []*message.Message{a, b})) {
		t.Fatal("encoding is not deterministic")
	}
}

func TestDataCorrupt(t *testing.T) {
	good := Encode([]byte("fp"), []*message.Message{message.NewMessage("x", []byte("payload"))})
	for i := 1; i < len(good); i++ {
		if _, _, err := Decode(good[:i]); !errors.Is(err, dedup.ErrCorruptRecord) {
			t.Fatalf("truncated to %d bytes: %v, want dedup.ErrCorruptRecord", i, err)
		}
	}
	if _, _, err := Decode([]byte{9}); !errors.Is(err, dedup.ErrCorruptRecord) {
		t.Fatalf("unknown version: %v", err)
	}
	if _, _, err := Decode(append(good, 0)); !errors.Is(err, dedup.ErrCorruptRecord) {
		t.Fatalf("trailing bytes: %v", err)
	}
	// A count no data could hold is refused before anything is made
	// for it (a map of 2^35 metadata pairs would not fit in memory).
	hugePairs := []byte{dataVersion, 0, 1, 1, 'u', 0xff, 0xff, 0xff, 0xff, 0x7f}
	if _, _, err := Decode(hugePairs); !errors.Is(err, dedup.ErrCorruptRecord) || !strings.Contains(err.Error(), "metadata pairs") {
		t.Fatalf("huge pairs: %v", err)
	}
	huge := []byte{dataVersion, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, _, err := Decode(huge); !errors.Is(err, dedup.ErrCorruptRecord) || !strings.Contains(err.Error(), "messages in") {
		t.Fatalf("huge count: %v, want the count named", err)
	}
}

func FuzzDecodeData(f *testing.F) {
	f.Add(Encode([]byte("fp"), []*message.Message{message.NewMessage("x", []byte("p"))}))
	f.Add([]byte{dataVersion})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _, _ = Decode(data) // must not panic or allocate without bound
	})
}

// TestDoneAtBounds: the completion time a record keeps is read up to the
// largest time.UnixMilli takes (math.MaxInt64 ms), and not past it; data
// without one, or not ours, has none.
func TestDoneAtBounds(t *testing.T) {
	at := func(ms uint64) []byte { return binary.AppendUvarint([]byte{dataVersionTime}, ms) }
	if got, ok := DoneAt(at(math.MaxInt64)); !ok || got.UnixMilli() != math.MaxInt64 {
		t.Fatalf("DoneAt(MaxInt64 ms) = %v, %v; want it read", got, ok)
	}
	if _, ok := DoneAt(at(math.MaxInt64 + 1)); ok {
		t.Fatal("DoneAt(MaxInt64+1 ms) read a time past time.UnixMilli's range")
	}
	if _, ok := DoneAt(Encode([]byte("fp"), nil)); ok {
		t.Fatal("DoneAt of data without a time read one")
	}
	if _, ok := DoneAt([]byte{9, 1}); ok {
		t.Fatal("DoneAt of data not ours read a time")
	}
}

// A version 3 record keeps the run's span context after the time: 25
// bytes more than version 2, and everything else as before.
func TestRunRoundTrip(t *testing.T) {
	run := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 0, 1},
		TraceFlags: trace.FlagsSampled,
	})
	at := time.UnixMilli(1_900_000_000_123)
	out := message.NewMessage("out", []byte("payload"))
	data := EncodeRun([]byte("fp"), []*message.Message{out}, at, run)
	if v2 := EncodeAt([]byte("fp"), []*message.Message{out}, at); len(data) != len(v2)+RunSize || data[0] != 3 {
		t.Fatalf("version %d of %d bytes, version 2 is %d: want 3 and %d more", data[0], len(data), len(v2), RunSize)
	}
	got, ok := RunOf(data)
	if !ok || got.TraceID() != run.TraceID() || got.SpanID() != run.SpanID() || got.TraceFlags() != run.TraceFlags() || !got.IsRemote() {
		t.Fatalf("RunOf = %v, %v; want %v, remote", got, ok, run)
	}
	if doneAt, ok := DoneAt(data); !ok || !doneAt.Equal(at) {
		t.Fatalf("DoneAt = %v, %v; want %v", doneAt, ok, at)
	}
	fp, msgs, err := Decode(data)
	if err != nil || string(fp) != "fp" || len(msgs) != 1 || msgs[0].UUID != "out" || string(msgs[0].Payload) != "payload" {
		t.Fatalf("Decode = %q, %v, %v", fp, msgs, err)
	}
	info, err := Inspect(data)
	if err != nil || info.Run.SpanID() != run.SpanID() || info.Outputs != 1 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	// Without a valid run, or without the time, no run is kept.
	if d := EncodeRun(nil, nil, at, trace.SpanContext{}); d[0] != 2 {
		t.Fatalf("a record without a run is version %d, want 2", d[0])
	}
	if d := EncodeRun(nil, nil, time.Time{}, run); d != nil {
		t.Fatalf("a record without time or contents = %x, want none", d)
	}
	for _, old := range [][]byte{nil, Encode([]byte("fp"), nil), EncodeAt(nil, nil, at)} {
		if _, ok := RunOf(old); ok {
			t.Fatalf("RunOf(%x) found a run", old)
		}
		if info, err := Inspect(old); err != nil || info.Run.IsValid() {
			t.Fatalf("Inspect(%x) = %+v, %v", old, info, err)
		}
	}
	// A version 3 record cut inside its run is corrupt.
	cut := EncodeRun(nil, nil, at, run)
	for n := 1; n < len(cut); n++ {
		if _, _, err := Decode(cut[:n]); !errors.Is(err, dedup.ErrCorruptRecord) {
			t.Fatalf("Decode of %d bytes of a version 3 record: %v", n, err)
		}
		if _, ok := RunOf(cut[:n]); ok && n < len(cut)-2 {
			t.Fatalf("RunOf of %d bytes of a version 3 record found a run", n)
		}
	}
}

// ParseRun reads exactly what AppendRun writes, and nothing else.
func TestParseRun(t *testing.T) {
	run := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}})
	b := AppendRun([]byte("x"), run)
	if len(b) != 1+RunSize {
		t.Fatalf("AppendRun appended %d bytes, want %d", len(b)-1, RunSize)
	}
	if got, ok := ParseRun(b[1:]); !ok || got.SpanID() != run.SpanID() || got.TraceID() != run.TraceID() {
		t.Fatalf("ParseRun = %v, %v", got, ok)
	}
	for _, bad := range [][]byte{nil, b, b[2:], make([]byte, RunSize)} {
		if _, ok := ParseRun(bad); ok {
			t.Fatalf("ParseRun(%x) = ok", bad)
		}
	}
	if b := AppendRun(nil, trace.SpanContext{}); b != nil {
		t.Fatalf("AppendRun of an invalid span context = %x", b)
	}
}
