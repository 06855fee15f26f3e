package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
)

// Records round-trip whatever the sizes of their parts: a long
// fingerprint with no outputs, long output UUIDs, payloads, metadata keys
// and values.
func TestDataRoundTripSizes(t *testing.T) {
	long := strings.Repeat("x", 1000)
	withMD := func(k, v string) *message.Message {
		m := message.NewMessage("u", nil)
		m.Metadata.Set(k, v)
		return m
	}
	cases := []struct {
		name string
		fp   []byte
		msgs []*message.Message
	}{
		{"long fingerprint, no outputs", []byte(long), nil},
		{"long uuid", nil, []*message.Message{message.NewMessage(long, nil)}},
		{"long payload", nil, []*message.Message{message.NewMessage("u", []byte(long))}},
		{"long metadata key", nil, []*message.Message{withMD(long, "")}},
		{"long metadata value", nil, []*message.Message{withMD("k", long)}},
	}
	for _, c := range cases {
		fp, msgs, err := Decode(Encode(c.fp, c.msgs))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(fp, c.fp) || len(msgs) != len(c.msgs) {
			t.Fatalf("%s: decoded fingerprint of %d bytes and %d messages", c.name, len(fp), len(msgs))
		}
		for i, want := range c.msgs {
			got := msgs[i]
			if got.UUID != want.UUID || !bytes.Equal(got.Payload, want.Payload) || len(got.Metadata) != len(want.Metadata) {
				t.Fatalf("%s: message %d differs", c.name, i)
			}
			for k, v := range want.Metadata {
				if got.Metadata[k] != v {
					t.Fatalf("%s: message %d metadata differs", c.name, i)
				}
			}
		}
	}
}

// A record claiming more metadata pairs than any memory could hold is
// corrupt: it is refused, never allocated.
func TestDataCorruptPairCount(t *testing.T) {
	for _, pairs := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // 2^64-1
		{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, // 2^63
	} {
		// version, no fingerprint, one message with an empty uuid, then the pair count
		data := append([]byte{dataVersion, 0, 1, 0}, pairs...)
		if _, _, err := Decode(data); !errors.Is(err, dedup.ErrCorruptRecord) {
			t.Fatalf("pair count % x: %v, want dedup.ErrCorruptRecord", pairs, err)
		}
	}
}

// A corrupt record claiming a million metadata pairs in a few bytes is
// refused without allocating room for them.
func TestDataCorruptPairCountAllocatesNothing(t *testing.T) {
	data := []byte{dataVersion, 0, 1, 0} // no fingerprint, one message, empty uuid
	data = binary.AppendUvarint(data, 1<<20)
	data = append(data, 1, 'k', 1, 'v', 0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := Decode(data)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, dedup.ErrCorruptRecord) {
		t.Fatalf("%v, want dedup.ErrCorruptRecord", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Fatalf("decoding a 10-byte corrupt record allocated %d bytes", n)
	}
}
