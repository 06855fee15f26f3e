// Package amqpkeys keys messages consumed from RabbitMQ (AMQP 0-9-1) with
// watermill-amqp by the delivery's own identity, so that messages
// published by producers that are not Watermill can be deduplicated.
//
// A Watermill publisher writes the message UUID in a header of its own
// (_watermill_message_uuid). Other producers set the AMQP message_id
// property instead, as RabbitMQ's documentation advises, and
// watermill-amqp's default marshaler drops every property: such a message
// reaches the handler with an empty UUID and nothing to key it by. Use
// [Marshaler] as the subscriber's marshaler:
//
//	cfg := amqp.NewDurableQueueConfig(url)
//	cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
//
// It carries message_id, correlation_id, timestamp, app_id and type into
// the message's metadata (see the Metadata constants) and uses message_id
// as the message UUID when the Watermill header is absent, so the
// middleware's default key, keyfuncs.MessageID(), works unchanged. Key by
// business fields as well with keyfuncs.All, since a producer that
// republishes an event usually gives it a new message_id.
//
// It is a separate package so that importing keyfuncs does not pull the
// AMQP client into every build.
package amqpkeys

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
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
	MetadataMessageID = "amqp_message_id"
	// MetadataCorrelationID is the correlation_id property.
	MetadataCorrelationID = "amqp_correlation_id"
	// MetadataTimestamp is the timestamp property (whole seconds in AMQP),
	// in RFC 3339, UTC. A timestamp at or before the Unix epoch (clients
	// send 0 for "none") or after the year 9999 (milliseconds sent where
	// AMQP wants seconds, as with JavaScript's Date.now()) is not carried.
	MetadataTimestamp = "amqp_timestamp"
	// MetadataAppID is the app_id property.
	MetadataAppID = "amqp_app_id"
	// MetadataType is the type property.
	MetadataType = "amqp_type"
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
	if len(d.Headers) > 0 {
		headers := make(amqp091.Table, len(d.Headers))
		for k, v := range d.Headers {
			headers[k] = headerString(v)
		}
		d.Headers = headers
	}
	msg, err := m.inner().Unmarshal(d)
	if err != nil {
		return nil, err
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	set := func(name, v string) {
		delete(msg.Metadata, name)
		if strings.TrimSpace(v) != "" {
			msg.Metadata.Set(name, v)
		}
	}
	set(MetadataMessageID, d.MessageId)
	set(MetadataCorrelationID, d.CorrelationId)
	ts := ""
	if d.Timestamp.Unix() > 0 && d.Timestamp.Year() <= 9999 {
		ts = d.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	set(MetadataTimestamp, ts)
	set(MetadataAppID, d.AppId)
	set(MetadataType, d.Type)
	if strings.TrimSpace(msg.UUID) == "" && strings.TrimSpace(d.MessageId) != "" {
		msg.UUID = d.MessageId
	}
	return msg, nil
}

// headerString is the string form of an AMQP table value.
func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp091.Decimal:
		return decimalString(v)
	case nil:
		return ""
	case amqp091.Table, []any:
		var b strings.Builder
		writeNested(&b, v)
		return b.String()
	default:
		return fmt.Sprint(v)
	}
}

// writeNested writes a table or array value in a JSON-like notation that
// keeps distinct values distinct: table keys sorted, strings (and byte
// arrays, timestamps) quoted as Go quotes them — bytes that are not UTF-8
// as \xNN, where JSON would turn them all into U+FFFD — and numbers,
// booleans, decimals and null bare. {"a":1} and {"a":"1"} differ.
func writeNested(b *strings.Builder, v any) {
	switch v := v.(type) {
	case amqp091.Table:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Quote(k))
			b.WriteByte(':')
			writeNested(b, v[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeNested(b, x)
		}
		b.WriteByte(']')
	case nil:
		b.WriteString("null")
	case string, []byte, time.Time:
		b.WriteString(strconv.Quote(headerString(v)))
	default: // numbers, booleans, decimals
		b.WriteString(headerString(v))
	}
}

// decimalString writes an AMQP decimal (Value × 10^-Scale) in decimal
// notation.
func decimalString(d amqp091.Decimal) string {
	digits := strconv.FormatInt(int64(d.Value), 10)
	sign := ""
	if d.Value < 0 {
		sign, digits = "-", digits[1:]
	}
	scale := int(d.Scale)
	if scale == 0 {
		return sign + digits
	}
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
}

// MessageID keys a message by its AMQP message_id property, as Marshaler
// carries it. Unlike keyfuncs.MessageID it never falls back to a Watermill
// UUID: use it to dedup on the producer's own id whoever published. A
// message without the property gives an error wrapping keyfuncs.ErrNoKey
// that says where it should have come from.
func MessageID() keyfuncs.KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		v := msg.Metadata.Get(MetadataMessageID)
		if strings.TrimSpace(v) == "" {
			return nil, fmt.Errorf("%w: message %s has no AMQP message_id (metadata %q): the producer did not set the property, or the subscriber's marshaler is not amqpkeys.Marshaler", keyfuncs.ErrNoKey, keyfuncs.Name(msg), MetadataMessageID)
		}
		return []string{keyfuncs.Bound(v)}, nil
	}
}

// PublishedAt is a middleware.Config.PublishedAt that reads the AMQP
// timestamp property, as Marshaler carries it, for the ttl-miss check.
// AMQP keeps whole seconds. A time at or before the Unix epoch is no time.
func PublishedAt(msg *message.Message) (time.Time, bool) {
	v := msg.Metadata.Get(MetadataTimestamp)
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || t.Unix() <= 0 {
		return time.Time{}, false
	}
	return t, true
}
