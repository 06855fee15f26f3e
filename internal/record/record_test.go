package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

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
