package amqpkeys_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/amqptest"
	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
	"github.com/watermill-dedup/dedup/middleware"
)

// TestDefaultMarshalerLosesTheIdentity is the problem Marshaler solves:
// watermill-amqp's own marshaler gives a message another producer
// published no UUID (it reads only Watermill's header) and no properties,
// so nothing can key it; a numeric header even fails the delivery.
func TestDefaultMarshalerLosesTheIdentity(t *testing.T) {
	msg, err := amqp.DefaultMarshaler{}.Unmarshal(amqp091.Delivery{MessageId: "order-17", Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keyfuncs.MessageID()(msg); msg.UUID != "" || !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("default marshaler: UUID %q, key error %v; want no UUID and no key", msg.UUID, err)
	}
	if _, err := (amqp.DefaultMarshaler{}).Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"attempt": int32(2)}}); err == nil {
		t.Fatal("default marshaler accepted a numeric header")
	}
}

func TestUnmarshalCarriesProperties(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	m := amqpkeys.Marshaler{}
	msg, err := m.Unmarshal(amqp091.Delivery{
		MessageId: "order-17", CorrelationId: "corr-9", Timestamp: at, AppId: "billing", Type: "payment.completed",
		Headers: amqp091.Table{"attempt": int32(2), "urgent": true, "trace": []byte("abc"), "sent": at, "name": "x"},
		Body:    []byte(`{"id":1}`),
	})
	if err != nil {
		t.Fatalf("Unmarshal of a delivery with non-string headers: %v", err)
	}
	if msg.UUID != "order-17" {
		t.Errorf("UUID = %q, want the message_id", msg.UUID)
	}
	for name, want := range map[string]string{
		amqpkeys.MetadataMessageID: "order-17", amqpkeys.MetadataCorrelationID: "corr-9",
		amqpkeys.MetadataTimestamp: "2030-01-02T03:04:05Z", amqpkeys.MetadataAppID: "billing", amqpkeys.MetadataType: "payment.completed",
		"attempt": "2", "urgent": "true", "trace": "abc", "sent": "2030-01-02T03:04:05Z", "name": "x",
	} {
		if got := msg.Metadata.Get(name); got != want {
			t.Errorf("metadata %q = %q, want %q", name, got, want)
		}
	}
	if got, ok := amqpkeys.PublishedAt(msg); !ok || !got.Equal(at) {
		t.Errorf("PublishedAt = %v, %v; want %v", got, ok, at)
	}
	keys, err := amqpkeys.MessageID()(msg)
	if err != nil || len(keys) != 1 || keys[0] != "order-17" {
		t.Errorf("MessageID() = %q, %v", keys, err)
	}

	// A message Watermill published keeps its UUID; no property, no key.
	pub, err := m.Marshal(message.NewMessage("wm-1", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	msg, err = m.Unmarshal(amqp091.Delivery{Headers: pub.Headers, Body: pub.Body})
	if err != nil || msg.UUID != "wm-1" {
		t.Fatalf("Watermill's own message: UUID %q, %v", msg.UUID, err)
	}
	if _, err := amqpkeys.MessageID()(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Errorf("MessageID() of a message without message_id = %v, want ErrNoKey", err)
	}
	if _, ok := amqpkeys.PublishedAt(msg); ok {
		t.Error("PublishedAt of a message without a timestamp reports one")
	}
}

// TestForeignProducerDeduplicated: a producer that is not Watermill
// publishes the same message twice with amqp091, the message_id property
// set and a numeric header; a router consuming with watermill-amqp,
// amqpkeys.Marshaler and the middleware's default key runs the handler
// once. With watermill-amqp's own marshaler the same deliveries have no
// UUID and no key.
func TestForeignProducerDeduplicated(t *testing.T) {
	url, queue, sub := amqptest.AMQPSubscriber(t, "amqpkeys-test-", func(url string) (*amqp.Subscriber, error) {
		cfg := amqp.NewDurableQueueConfig(url)
		cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
		return amqp.NewSubscriber(cfg, watermill.NopLogger{})
	})

	var (
		mu   sync.Mutex
		runs = map[string]int{}
		acks = make(chan string, 16)
	)
	keytest.Run(t, sub, queue, middleware.Config{PublishedAt: amqpkeys.PublishedAt}, func(msg *message.Message, err error) {
		if err == nil {
			acks <- msg.Metadata.Get(amqpkeys.MetadataMessageID)
		}
	}, func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		return nil
	})

	amqptest.PublishForeignTwice(t, url, queue) // the producer retries: the same message twice
	for _, id := range keytest.Await(t, acks, 2) {
		if id != "order-42" {
			t.Fatalf("acked a delivery with message_id %q", id)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["order-42"] != 1 || len(runs) != 1 {
		t.Fatalf("handler runs by UUID = %v, want order-42 once", runs)
	}
}

// TestHeadersCannotStandInForProperties: a header named like one of the
// Marshaler's metadata names (a forwarded message's metadata, or a
// producer's own header) is not taken for the property. Otherwise every
// message a handler fans out with copied metadata would carry the same
// amqp_message_id, and the key would collapse distinct events.
func TestHeadersCannotStandInForProperties(t *testing.T) {
	headers := amqp091.Table{
		amqpkeys.MetadataMessageID: "forwarded-1", amqpkeys.MetadataCorrelationID: "c",
		amqpkeys.MetadataTimestamp: "2030-01-02T03:04:05Z", amqpkeys.MetadataAppID: "a", amqpkeys.MetadataType: "t",
		"other": "kept",
	}
	msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: headers, Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{amqpkeys.MetadataMessageID, amqpkeys.MetadataCorrelationID, amqpkeys.MetadataTimestamp, amqpkeys.MetadataAppID, amqpkeys.MetadataType} {
		if v, ok := msg.Metadata[name]; ok {
			t.Errorf("metadata %q = %q from a header, want it absent when the property is not set", name, v)
		}
	}
	if msg.Metadata.Get("other") != "kept" {
		t.Errorf("other headers must pass through: %v", msg.Metadata)
	}
	if msg.UUID != "" {
		t.Errorf("UUID = %q from a header, want none", msg.UUID)
	}
	if _, err := amqpkeys.MessageID()(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Errorf("MessageID() = %v, want ErrNoKey", err)
	}
	if _, ok := amqpkeys.PublishedAt(msg); ok {
		t.Error("PublishedAt took the time from a header")
	}

	// The property wins when both are set.
	msg, err = amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: "own-2", Headers: headers})
	if err != nil || msg.Metadata.Get(amqpkeys.MetadataMessageID) != "own-2" {
		t.Fatalf("message_id = %q, %v; want the property", msg.Metadata.Get(amqpkeys.MetadataMessageID), err)
	}
}

// TestZeroTimestampIsNoTime: AMQP has no "unset" timestamp on the wire
// other than leaving the property out, but clients send 0; the Unix epoch
// (or earlier) is no publication time, and reading it as one would log
// every message as older than the retention window.
func TestZeroTimestampIsNoTime(t *testing.T) {
	for _, ts := range []time.Time{time.Unix(0, 0), time.Unix(-5, 0)} {
		msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: "m", Timestamp: ts})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := msg.Metadata[amqpkeys.MetadataTimestamp]; ok {
			t.Errorf("timestamp %v carried as %q, want absent", ts, v)
		}
		msg.Metadata.Set(amqpkeys.MetadataTimestamp, ts.UTC().Format(time.RFC3339Nano))
		if got, ok := amqpkeys.PublishedAt(msg); ok {
			t.Errorf("PublishedAt(%v) = %v, want no time", ts, got)
		}
	}
}

// TestNestedHeadersStayDistinct: header values other producers send
// (tables, arrays, decimals, byte arrays inside them) become strings that
// keep distinct values distinct, so a key on such a header cannot merge
// two events.
func TestNestedHeadersStayDistinct(t *testing.T) {
	values := map[string]any{
		"table int":    amqp091.Table{"a": int32(1)},
		"table string": amqp091.Table{"a": "1"},
		"table bytes":  amqp091.Table{"a": []byte("x")},
		"table x":      amqp091.Table{"a": "x", "b": nil},
		"array":        []any{int32(1), "2"},
		"array 2":      []any{"1", "2"},
		"decimal":      amqp091.Decimal{Scale: 2, Value: 12345},
		"decimal 2":    amqp091.Decimal{Scale: 1, Value: 12345},
		"negative":     amqp091.Decimal{Scale: 3, Value: -5},
	}
	want := map[string]string{
		"decimal": "123.45", "decimal 2": "1234.5", "negative": "-0.005",
		"table bytes": `{"a":"x"}`, "table int": `{"a":1}`, "table string": `{"a":"1"}`,
	}
	seen := map[string]string{}
	for name, v := range values {
		msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"h": v}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := msg.Metadata.Get("h")
		if w, ok := want[name]; ok && got != w {
			t.Errorf("%s: header = %q, want %q", name, got, w)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s both became %q", name, other, got)
		}
		seen[got] = name
	}
}

// TestBlankMessageIDIsNoKey: a message_id of spaces is no identity: it is
// neither the UUID nor a key.
func TestBlankMessageIDIsNoKey(t *testing.T) {
	for _, id := range []string{" ", "\t", " \n "} {
		msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: id})
		if err != nil {
			t.Fatal(err)
		}
		if msg.UUID != "" {
			t.Errorf("message_id %q became the UUID", id)
		}
		if keys, err := amqpkeys.MessageID()(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("MessageID() of message_id %q = %q, %v; want ErrNoKey", id, keys, err)
		}
	}
}

// TestLongMessageIDRefusedNotTruncated: message_id is an AMQP short string
// (at most 255 bytes). The client this module requires refuses a longer
// one at publish; an older one cut it on the wire, so two ids that share
// 255 bytes became one key.
func TestLongMessageIDRefusedNotTruncated(t *testing.T) {
	url := testkit.RequireAMQP(t)
	ch := amqptest.AMQPChannel(t, url)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 256)
	if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp091.Publishing{MessageId: long}); err == nil {
		t.Fatal("a 256-byte message_id was published; the client truncates it on the wire")
	}
}

// TestNestedBytesStayDistinct: byte arrays and strings that are not UTF-8
// inside tables and arrays (binary ids) keep their bytes: two different
// ones never become the same string (JSON would turn both into U+FFFD).
func TestNestedBytesStayDistinct(t *testing.T) {
	values := []any{
		[]any{[]byte{0xff}}, []any{[]byte{0xfe}}, []any{"\xfa"},
		amqp091.Table{"k\xfe": "v"}, amqp091.Table{"k\xff": "v"},
		amqp091.Table{"k": []byte{0x80, 0x81}}, amqp091.Table{"k": []byte{0x80, 0x82}},
	}
	seen := map[string]int{}
	for i, v := range values {
		msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"h": v}})
		if err != nil {
			t.Fatal(err)
		}
		got := msg.Metadata.Get("h")
		if j, dup := seen[got]; dup {
			t.Errorf("values %d (%#v) and %d (%#v) both became %q", j, values[j], i, v, got)
		}
		seen[got] = i
	}
}

// TestBlankUUIDHeaderFallsBackToMessageID: a Watermill UUID header of
// white space is no UUID; the message_id is.
func TestBlankUUIDHeaderFallsBackToMessageID(t *testing.T) {
	msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: "evt-1", Headers: amqp091.Table{amqp.DefaultMessageUUIDHeaderKey: " "}})
	if err != nil {
		t.Fatal(err)
	}
	if msg.UUID != "evt-1" {
		t.Fatalf("UUID = %q, want the message_id", msg.UUID)
	}
}

// TestTimestampBeyondYear9999IsNoTime: a producer that sends milliseconds
// where AMQP wants seconds (Date.now()) gives a time tens of thousands of
// years ahead: that is no publication time, and it is not carried.
func TestTimestampBeyondYear9999IsNoTime(t *testing.T) {
	msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: "m", Timestamp: time.Unix(1_700_000_000_000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := msg.Metadata[amqpkeys.MetadataTimestamp]; ok {
		t.Errorf("a timestamp in milliseconds was carried as %q", v)
	}
}
