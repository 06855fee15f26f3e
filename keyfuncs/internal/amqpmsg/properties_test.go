package amqpmsg_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/amqpmsg"
)

// namedLikeProperties are headers named like the metadata the properties
// are carried under, as a forwarded message's copied metadata would be.
var namedLikeProperties = amqp091.Table{
	amqpmsg.MetadataMessageID: "forwarded-1", amqpmsg.MetadataCorrelationID: "c",
	amqpmsg.MetadataTimestamp: "2030-01-02T03:04:05Z", amqpmsg.MetadataAppID: "a", amqpmsg.MetadataType: "t",
	"other": "kept",
}

// TestPropertiesIntoMetadata: the delivery's properties are carried into
// metadata under their names, in place of headers so named; a blank
// property is not carried, and a header named like it is dropped.
func TestPropertiesIntoMetadata(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("EST", -5*3600))
	msg, err := amqpmsg.Unmarshal(amqp091.Delivery{
		MessageId: "order-17", CorrelationId: "corr-9", Timestamp: at, AppId: "billing", Type: "payment.completed",
		Headers: namedLikeProperties,
	}, stringsOnly)
	if err != nil {
		t.Fatal(err)
	}
	want := message.Metadata{
		amqpmsg.MetadataMessageID: "order-17", amqpmsg.MetadataCorrelationID: "corr-9",
		amqpmsg.MetadataTimestamp: "2030-01-02T08:04:05Z", amqpmsg.MetadataAppID: "billing", amqpmsg.MetadataType: "payment.completed",
		"other": "kept",
	}
	if !reflect.DeepEqual(msg.Metadata, want) {
		t.Errorf("metadata = %v, want %v", msg.Metadata, want)
	}
	if got, ok := amqpmsg.PublishedAt(msg); !ok || !got.Equal(at) {
		t.Errorf("PublishedAt = %v, %v; want %v", got, ok, at)
	}

	msg, err = amqpmsg.Unmarshal(amqp091.Delivery{MessageId: " ", CorrelationId: "\t", Type: " \n", Headers: namedLikeProperties}, stringsOnly)
	if err != nil {
		t.Fatal(err)
	}
	if want := (message.Metadata{"other": "kept"}); !reflect.DeepEqual(msg.Metadata, want) {
		t.Errorf("blank properties: metadata = %v, want %v", msg.Metadata, want)
	}
}

// TestInnerErrorFailsTheDelivery: when the inner unmarshaler fails, so
// does Unmarshal, with its error.
func TestInnerErrorFailsTheDelivery(t *testing.T) {
	bad := errors.New("bad body")
	msg, err := amqpmsg.Unmarshal(amqp091.Delivery{MessageId: "m-1"}, func(amqp091.Delivery) (*message.Message, error) {
		return nil, bad
	})
	if !errors.Is(err, bad) || msg != nil {
		t.Fatalf("Unmarshal = %v, %v; want the inner error", msg, err)
	}
}

// TestInnerWithoutMetadata: a message the inner unmarshaler made without
// metadata still gets the properties.
func TestInnerWithoutMetadata(t *testing.T) {
	msg, err := amqpmsg.Unmarshal(amqp091.Delivery{MessageId: "m-1", Type: "created"}, func(d amqp091.Delivery) (*message.Message, error) {
		return &message.Message{Payload: d.Body}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := message.Metadata{amqpmsg.MetadataMessageID: "m-1", amqpmsg.MetadataType: "created"}
	if !reflect.DeepEqual(msg.Metadata, want) || msg.UUID != "m-1" {
		t.Errorf("message %q with metadata %v, want m-1 with %v", msg.UUID, msg.Metadata, want)
	}
}

// TestMessageIDStandsInForAMissingUUID: the message_id becomes the UUID
// only when the inner unmarshaler found none (or a blank one), and only
// when it is not blank itself.
func TestMessageIDStandsInForAMissingUUID(t *testing.T) {
	for _, c := range []struct {
		headers   amqp091.Table
		messageID string
		want      string
	}{
		{amqp091.Table{"uuid": "wm-1"}, "order-1", "wm-1"},
		{amqp091.Table{"uuid": " "}, "order-1", "order-1"},
		{nil, "order-1", "order-1"},
		{nil, " ", ""},
		{amqp091.Table{"uuid": "wm-1"}, "", "wm-1"},
	} {
		msg, err := amqpmsg.Unmarshal(amqp091.Delivery{MessageId: c.messageID, Headers: c.headers}, stringsOnly)
		if err != nil {
			t.Fatal(err)
		}
		if msg.UUID != c.want {
			t.Errorf("UUID header %v, message_id %q: UUID %q, want %q", c.headers["uuid"], c.messageID, msg.UUID, c.want)
		}
	}
}

// TestTimestampCarriedWithinRange: a timestamp after the Unix epoch and
// within the year 9999 is carried, in RFC 3339 (UTC); one at or before
// the epoch (clients send 0 for none) or beyond 9999 (milliseconds where
// AMQP wants seconds) is not, nor a header named like it.
func TestTimestampCarriedWithinRange(t *testing.T) {
	for _, c := range []struct {
		at   time.Time
		want string // "": not carried
	}{
		{time.Unix(-1, 0), ""},
		{time.Unix(0, 0), ""},
		{time.Unix(1, 0), "1970-01-01T00:00:01Z"},
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), "9999-12-31T23:59:59Z"},
		{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), ""},
		{time.Unix(1_700_000_000_000, 0), ""},
	} {
		msg, err := amqpmsg.Unmarshal(amqp091.Delivery{MessageId: "m", Timestamp: c.at, Headers: namedLikeProperties}, stringsOnly)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := msg.Metadata[amqpmsg.MetadataTimestamp]
		if c.want == "" && ok {
			t.Errorf("timestamp %v carried as %q, want absent", c.at, got)
		}
		if c.want != "" && got != c.want {
			t.Errorf("timestamp %v carried as %q, want %q", c.at, got, c.want)
		}
	}
}

// TestMessageIDKey: MessageID keys a message by the carried message_id;
// a message without one, or with a blank one, has no key.
func TestMessageIDKey(t *testing.T) {
	key := amqpmsg.MessageID()
	msg := message.NewMessage("wm-1", nil)
	msg.Metadata.Set(amqpmsg.MetadataMessageID, "order-17")
	if keys, err := key(msg); err != nil || !reflect.DeepEqual(keys, []string{"order-17"}) {
		t.Errorf("MessageID() = %q, %v; want [order-17]", keys, err)
	}
	for _, v := range []string{"", " ", "\t\n"} {
		msg := message.NewMessage("wm-1", nil)
		msg.Metadata.Set(amqpmsg.MetadataMessageID, v)
		if keys, err := key(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("MessageID() with message_id %q = %q, %v; want ErrNoKey", v, keys, err)
		}
	}
}

// TestPublishedAt: PublishedAt reads the carried timestamp; none, one
// that does not parse, or one at or before the Unix epoch is no time.
func TestPublishedAt(t *testing.T) {
	for _, c := range []struct {
		v    string
		want time.Time // zero: no time
	}{
		{"", time.Time{}},
		{"yesterday", time.Time{}},
		{"1969-12-31T23:59:59Z", time.Time{}},
		{"1970-01-01T00:00:00Z", time.Time{}},
		{"1970-01-01T00:00:01Z", time.Unix(1, 0)},
		{"2030-01-02T03:04:05.5Z", time.Date(2030, 1, 2, 3, 4, 5, 5e8, time.UTC)},
	} {
		msg := message.NewMessage("m", nil)
		msg.Metadata.Set(amqpmsg.MetadataTimestamp, c.v)
		got, ok := amqpmsg.PublishedAt(msg)
		if ok != !c.want.IsZero() || !got.Equal(c.want) {
			t.Errorf("PublishedAt(%q) = %v, %v; want %v", c.v, got, ok, c.want)
		}
	}
}
