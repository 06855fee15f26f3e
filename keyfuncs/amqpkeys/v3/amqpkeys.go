package amqpkeys

import (
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/amqpmsg"
)

// The metadata names under which Marshaler carries a delivery's AMQP
// properties, as in keyfuncs/amqpkeys (see there).
const (
	MetadataMessageID     = amqpmsg.MetadataMessageID
	MetadataCorrelationID = amqpmsg.MetadataCorrelationID
	MetadataTimestamp     = amqpmsg.MetadataTimestamp
	MetadataAppID         = amqpmsg.MetadataAppID
	MetadataType          = amqpmsg.MetadataType
)

// Marshaler is a watermill-amqp v3 Marshaler for consuming messages that
// producers other than Watermill published: it marshals as Inner does,
// and unmarshals as Inner does with what keyfuncs/amqpkeys.Marshaler
// adds (the properties in metadata, message_id as the UUID when Inner
// found none, headers made strings). A message published by Watermill
// keeps its UUID.
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
// carries it, never by a Watermill UUID. A message without the property
// gives an error wrapping keyfuncs.ErrNoKey.
func MessageID() keyfuncs.KeyFunc { return amqpmsg.MessageID() }

// PublishedAt is a middleware.Config.PublishedAt that reads the AMQP
// timestamp property, as Marshaler carries it (whole seconds), for the
// ttl-miss check.
func PublishedAt(msg *message.Message) (time.Time, bool) { return amqpmsg.PublishedAt(msg) }
