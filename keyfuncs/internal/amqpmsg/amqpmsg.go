// Package amqpmsg is what keyfuncs/amqpkeys (watermill-amqp v2) and
// keyfuncs/amqpkeys/v3 (watermill-amqp v3) share: the unmarshaling of a
// delivery's properties and headers into a message, and the key and time
// read from them. It imports no watermill-amqp major, so that a build on
// one major compiles nothing of the other. The exported names are
// documented in amqpkeys.
package amqpmsg

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

// The metadata names of the properties (see amqpkeys).
const (
	MetadataMessageID     = "amqp_message_id"
	MetadataCorrelationID = "amqp_correlation_id"
	MetadataTimestamp     = "amqp_timestamp"
	MetadataAppID         = "amqp_app_id"
	MetadataType          = "amqp_type"
)

// Unmarshal unmarshals d with inner, a watermill-amqp marshaler's
// Unmarshal, as amqpkeys.Marshaler documents: headers made strings first,
// then the properties carried into metadata and message_id made the UUID
// when inner found none.
func Unmarshal(d amqp091.Delivery, inner func(amqp091.Delivery) (*message.Message, error)) (*message.Message, error) {
	if len(d.Headers) > 0 {
		headers := make(amqp091.Table, len(d.Headers))
		for k, v := range d.Headers {
			headers[k] = headerString(v)
		}
		d.Headers = headers
	}
	msg, err := inner(d)
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

// MessageID is amqpkeys.MessageID.
func MessageID() keyfuncs.KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		v := msg.Metadata.Get(MetadataMessageID)
		if strings.TrimSpace(v) == "" {
			return nil, fmt.Errorf("%w: message %s has no AMQP message_id (metadata %q): the producer did not set the property, or the subscriber's marshaler is not amqpkeys.Marshaler", keyfuncs.ErrNoKey, keyfuncs.Name(msg), MetadataMessageID)
		}
		return []string{keyfuncs.Bound(v)}, nil
	}
}

// PublishedAt is amqpkeys.PublishedAt.
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
