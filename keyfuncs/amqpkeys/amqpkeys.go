package amqpkeys

import (
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/amqpmsg"
)

// The metadata names under which Marshaler carries a delivery's AMQP
// properties. A property that is not set leaves its name absent, even when
// a header of that name arrived: such a header (metadata a Watermill
// handler copied to the messages it forwards, or a producer's own) is
// dropped, so it cannot stand in for the property and merge distinct
// events under one key.
const (
	// MetadataMessageID is the message_id property. AMQP 0-9-1 carries it
	// as a short string, at most 255 bytes, and the producer's client
	// enforces that: current clients refuse a longer id at publish, but
	// some (amqp091-go before v1.11 among them) cut its length to one byte
	// on the wire, so the consumer receives a shorter, or empty, id and
	// cannot tell. Producers must keep ids within 255 bytes; combine the id
	// with a business key (keyfuncs.All) so that a cut id cannot merge two
	// events. A blank one (white space only) is not carried.
	MetadataMessageID = amqpmsg.MetadataMessageID
	// MetadataCorrelationID is the correlation_id property.
	MetadataCorrelationID = amqpmsg.MetadataCorrelationID
	// MetadataTimestamp is the timestamp property (whole seconds in AMQP),
	// in RFC 3339, UTC. A timestamp at or before the Unix epoch (clients
	// send 0 for "none") or after the year 9999 (milliseconds sent where
	// AMQP wants seconds, as with JavaScript's Date.now()) is not carried.
	MetadataTimestamp = amqpmsg.MetadataTimestamp
	// MetadataAppID is the app_id property.
	MetadataAppID = amqpmsg.MetadataAppID
	// MetadataType is the type property.
	MetadataType = amqpmsg.MetadataType
)

// Marshaler is a watermill-amqp Marshaler for consuming messages that
// producers other than Watermill published. It marshals as Inner does, and
// unmarshals as Inner does, then:
//
//   - carries the delivery's message_id, correlation_id, timestamp, app_id
//     and type properties into metadata (see the Metadata constants);
//   - uses message_id as the message UUID when Inner found none (no
//     Watermill UUID header, or a blank one);
//   - before that, turns header values that are not strings into strings:
//     watermill-amqp's default marshaler fails the delivery on them, and
//     the message would be redelivered for ever. Numbers and booleans are
//     written as Go formats them, timestamps in RFC 3339 (UTC), byte
//     arrays as their bytes, decimals in decimal notation ("123.45"), and
//     tables and arrays in a JSON-like notation (keys sorted, strings
//     quoted as Go quotes them, so bytes that are not UTF-8 stay
//     distinct), so distinct values of one type stay distinct. Values of
//     different types can meet: the string "1", the integer 1 and the
//     bytes "1" all become "1";
//   - drops headers named like the Metadata constants (see there).
//
// A message published by Watermill keeps its UUID.
type Marshaler struct {
	// Inner marshals the body and headers. Nil means amqp.DefaultMarshaler{}.
	Inner amqp.Marshaler
}

var _ amqp.Marshaler = Marshaler{}

func (m Marshaler) inner() amqp.Marshaler {
	if m.Inner == nil {
		return amqp.DefaultMarshaler{}
	}
	return m.Inner
}

// Marshal implements amqp.Marshaler: as Inner.
func (m Marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	return m.inner().Marshal(msg)
}

// Unmarshal implements amqp.Marshaler.
func (m Marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	return amqpmsg.Unmarshal(d, m.inner().Unmarshal)
}

// MessageID keys a message by its AMQP message_id property, as Marshaler
// carries it. Unlike keyfuncs.MessageID it never falls back to a Watermill
// UUID: use it to dedup on the producer's own id whoever published. A
// message without the property gives an error wrapping keyfuncs.ErrNoKey
// that says where it should have come from.
func MessageID() keyfuncs.KeyFunc { return amqpmsg.MessageID() }

// PublishedAt is a middleware.Config.PublishedAt that reads the AMQP
// timestamp property, as Marshaler carries it, for the ttl-miss check.
// AMQP keeps whole seconds. A time at or before the Unix epoch is no time.
func PublishedAt(msg *message.Message) (time.Time, bool) { return amqpmsg.PublishedAt(msg) }
