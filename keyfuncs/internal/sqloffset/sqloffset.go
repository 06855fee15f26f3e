// Package sqloffset is what keyfuncs/sqlkeys (watermill-sql v3) and
// keyfuncs/sqlkeys/v4 (watermill-sql v4) share: the metadata that carries
// a row's offset, and the key made of it. It imports no watermill-sql
// major, so that a build on one major compiles nothing of the other.
package sqloffset

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

// Metadata is the metadata name under which the schema adapters carry a
// row's offset (decimal).
const Metadata = "sql_offset"

// Set writes offset into msg's metadata under Metadata.
func Set(msg *message.Message, offset int64) {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(Metadata, strconv.FormatInt(offset, 10))
}

// Key keys a message by "topic/offset" (see sqlkeys.Offset).
func Key() keyfuncs.KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		topic := message.SubscribeTopicFromCtx(msg.Context())
		offset := msg.Metadata.Get(Metadata)
		switch {
		case topic == "":
			return nil, fmt.Errorf("%w: message %s: no subscribe topic in its context (not consumed through a Watermill router)", keyfuncs.ErrNoKey, keyfuncs.Name(msg))
		case offset == "":
			return nil, fmt.Errorf("%w: message %s: no row offset (metadata %q): is sqlkeys.SchemaAdapter the subscriber's schema adapter?", keyfuncs.ErrNoKey, keyfuncs.Name(msg), Metadata)
		}
		return []string{keyfuncs.Bound(topic + "/" + offset)}, nil
	}
}
