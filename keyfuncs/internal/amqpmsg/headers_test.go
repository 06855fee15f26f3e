package amqpmsg_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs/internal/amqpmsg"
)

// stringsOnly is an inner unmarshaler like watermill-amqp's default one:
// it takes the UUID from the "uuid" header and every other header into
// metadata, and fails the delivery on a header that is not a string.
func stringsOnly(d amqp091.Delivery) (*message.Message, error) {
	msg := message.NewMessage("", d.Body)
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("header %q is a %T, not a string", k, v)
		}
		if k == "uuid" {
			msg.UUID = s
			continue
		}
		msg.Metadata.Set(k, s)
	}
	return msg, nil
}

// header is the metadata value a delivery whose header "h" is v gets.
func header(t *testing.T, v any) string {
	t.Helper()
	msg, err := amqpmsg.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"h": v}}, stringsOnly)
	if err != nil {
		t.Fatalf("header %#v: %v", v, err)
	}
	got, ok := msg.Metadata["h"]
	if !ok {
		t.Fatalf("header %#v: not in metadata %v", v, msg.Metadata)
	}
	return got
}

// TestHeadersBecomeStrings: the inner unmarshaler gets every header as a
// string, written as the amqpkeys package doc says: numbers and booleans
// as Go formats them, byte arrays as their bytes, timestamps in RFC 3339
// (UTC), null as nothing, tables and arrays in a JSON-like notation with
// the keys sorted and strings quoted.
func TestHeadersBecomeStrings(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 600, time.FixedZone("CET", 3600))
	for _, c := range []struct {
		v    any
		want string
	}{
		{"plain", "plain"},
		{int32(2), "2"},
		{int64(-7), "-7"},
		{true, "true"},
		{[]byte("abc"), "abc"},
		{at, "2030-01-02T02:04:05.0000006Z"},
		{nil, ""},
		{amqp091.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{amqp091.Table{}, "{}"},
		{amqp091.Table{"a": int32(1)}, `{"a":1}`},
		{amqp091.Table{"b": []any{int64(1), "x"}, "a": nil, "c": true}, `{"a":null,"b":[1,"x"],"c":true}`},
		{amqp091.Table{"k\xff": []byte{0x80}, "t": at}, `{"k\xff":"\x80","t":"2030-01-02T02:04:05.0000006Z"}`},
		{[]any{}, "[]"},
		{[]any{"1"}, `["1"]`},
		{[]any{"1", int32(2), nil, amqp091.Decimal{Scale: 1, Value: 5}, amqp091.Table{"x": "y"}}, `["1",2,null,0.5,{"x":"y"}]`},
	} {
		if got := header(t, c.v); got != c.want {
			t.Errorf("header %#v became %q, want %q", c.v, got, c.want)
		}
	}
}

// TestDecimalNotation: an AMQP decimal is Value × 10^-Scale, written in
// decimal notation with a leading zero before the point and every digit
// of the scale kept.
func TestDecimalNotation(t *testing.T) {
	for _, c := range []struct {
		d    amqp091.Decimal
		want string
	}{
		{amqp091.Decimal{Scale: 0, Value: 0}, "0"},
		{amqp091.Decimal{Scale: 0, Value: 5}, "5"},
		{amqp091.Decimal{Scale: 0, Value: -5}, "-5"},
		{amqp091.Decimal{Scale: 1, Value: 0}, "0.0"},
		{amqp091.Decimal{Scale: 2, Value: 12}, "0.12"},
		{amqp091.Decimal{Scale: 2, Value: -12}, "-0.12"},
		{amqp091.Decimal{Scale: 2, Value: 123}, "1.23"},
		{amqp091.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{amqp091.Decimal{Scale: 2, Value: -12345}, "-123.45"},
		{amqp091.Decimal{Scale: 3, Value: 5}, "0.005"},
		{amqp091.Decimal{Scale: 3, Value: -5}, "-0.005"},
		{amqp091.Decimal{Scale: 1, Value: -2147483648}, "-214748364.8"},
	} {
		if got := header(t, c.d); got != c.want {
			t.Errorf("decimal %+v became %q, want %q", c.d, got, c.want)
		}
	}
}
