package sqloffset_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/sqloffset"
)

// TestSetKeepsMetadata: Set adds the offset to the metadata a message
// has, and gives a message without metadata some.
func TestSetKeepsMetadata(t *testing.T) {
	msg := message.NewMessage("m-1", nil)
	msg.Metadata.Set("source", "billing")
	sqloffset.Set(msg, 42)
	if want := (message.Metadata{"source": "billing", sqloffset.Metadata: "42"}); !reflect.DeepEqual(msg.Metadata, want) {
		t.Errorf("metadata = %v, want %v", msg.Metadata, want)
	}

	bare := &message.Message{UUID: "m-2"}
	sqloffset.Set(bare, 7)
	if want := (message.Metadata{sqloffset.Metadata: "7"}); !reflect.DeepEqual(bare.Metadata, want) {
		t.Errorf("metadata = %v, want %v", bare.Metadata, want)
	}
}

// TestKeyIsTopicAndOffset: messages consumed through a router are keyed
// by their subscribe topic and the offset Set gave them; one without an
// offset, or outside a router, has no key.
func TestKeyIsTopicAndOffset(t *testing.T) {
	const topic = "rows"
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	var msgs []*message.Message
	for _, offset := range []int64{7, 8} {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		sqloffset.Set(msg, offset)
		msgs = append(msgs, msg)
	}
	if err := ps.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	_, keys := keytest.Count(t, ps, topic, 2, sqloffset.Key(), nil)
	if want := map[string]bool{"rows/7": true, "rows/8": true}; !reflect.DeepEqual(keys, want) {
		t.Errorf("keys = %v, want %v", keys, want)
	}

	withOffset := message.NewMessage("m-3", nil)
	sqloffset.Set(withOffset, 9)
	for _, msg := range []*message.Message{message.NewMessage("m-4", nil), withOffset} {
		if keys, err := sqloffset.Key()(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("Key() of %s outside a router = %q, %v; want ErrNoKey", msg.UUID, keys, err)
		}
	}
}
