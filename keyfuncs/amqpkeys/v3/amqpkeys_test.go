package amqpkeys_test

import (
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp2 "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/internal/testkit/amqptest"
	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	amqpkeys2 "github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
	amqpkeys "github.com/watermill-dedup/dedup/keyfuncs/amqpkeys/v3"
	"github.com/watermill-dedup/dedup/middleware"
)

// TestSameAsV2: the v3 Marshaler (on v3's default marshaler) gives every
// delivery the UUID, metadata and payload the v2 one gives it, and the
// keys and times read from them are the same, so a consumer moving from
// watermill-amqp v2 to v3 keeps its records' meaning. v3's own marshaler
// still needs it: like v2's, it gives a foreign delivery no UUID and
// fails one with a numeric header.
func TestSameAsV2(t *testing.T) {
	plain, err := amqp.DefaultMarshaler{}.Unmarshal(amqp091.Delivery{MessageId: "order-17", Body: []byte("x")})
	if err != nil || plain.UUID != "" {
		t.Fatalf("v3's default marshaler: UUID %q, %v; want none (the problem Marshaler solves)", plain.UUID, err)
	}
	if _, err := (amqp.DefaultMarshaler{}).Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"attempt": int32(2)}}); err == nil {
		t.Fatal("v3's default marshaler accepted a numeric header")
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	watermillPub, err := amqpkeys.Marshaler{}.Marshal(message.NewMessage("wm-1", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]amqp091.Delivery{
		"foreign": {
			MessageId: "order-17", CorrelationId: "corr-9", Timestamp: at, AppId: "billing", Type: "payment.completed",
			Headers: amqp091.Table{
				"attempt": int32(2), "urgent": true, "trace": []byte("abc"), "sent": at, "price": amqp091.Decimal{Scale: 2, Value: 12345},
				"nested": amqp091.Table{"b": []any{int64(1), "x"}, "a": nil}, amqpkeys.MetadataAppID: "a header, not the property",
			},
			Body: []byte(`{"id":1}`),
		},
		"watermill":        {Headers: watermillPub.Headers, Body: watermillPub.Body},
		"blank message_id": {MessageId: "  ", Body: []byte("y")},
		"epoch timestamp":  {MessageId: "order-18", Timestamp: time.Unix(0, 0)},
	} {
		v3, err3 := amqpkeys.Marshaler{}.Unmarshal(d)
		v2, err2 := amqpkeys2.Marshaler{}.Unmarshal(d)
		if err3 != nil || err2 != nil {
			t.Fatalf("%s: v3 %v, v2 %v", name, err3, err2)
		}
		if v3.UUID != v2.UUID || !reflect.DeepEqual(v3.Metadata, v2.Metadata) || string(v3.Payload) != string(v2.Payload) {
			t.Errorf("%s: v3 gives %q %v %q, v2 %q %v %q", name, v3.UUID, v3.Metadata, v3.Payload, v2.UUID, v2.Metadata, v2.Payload)
		}
		k3, e3 := amqpkeys.MessageID()(v3)
		k2, e2 := amqpkeys2.MessageID()(v2)
		if !reflect.DeepEqual(k3, k2) || errors.Is(e3, keyfuncs.ErrNoKey) != errors.Is(e2, keyfuncs.ErrNoKey) {
			t.Errorf("%s: MessageID() v3 %q %v, v2 %q %v", name, k3, e3, k2, e2)
		}
		t3, ok3 := amqpkeys.PublishedAt(v3)
		t2, ok2 := amqpkeys2.PublishedAt(v2)
		if ok3 != ok2 || !t3.Equal(t2) {
			t.Errorf("%s: PublishedAt v3 %v %v, v2 %v %v", name, t3, ok3, t2, ok2)
		}
	}
	// The Inner of either is a marshaler of its own major.
	var _ amqp2.Marshaler = amqpkeys2.Marshaler{Inner: amqp2.DefaultMarshaler{}}
	var _ amqp.Marshaler = amqpkeys.Marshaler{Inner: amqp.DefaultMarshaler{}}
}

// TestForeignProducerDeduplicated: a producer that is not Watermill
// publishes the same message twice with amqp091 (message_id set, a
// numeric header); a router consuming with watermill-amqp v3,
// amqpkeys.Marshaler and the middleware's default key fails the first
// delivery once (v3 then redelivers it, marked redelivered) and runs the
// handler to success once: three deliveries acked or nacked, one effect.
func TestForeignProducerDeduplicated(t *testing.T) {
	url, queue, sub := amqptest.AMQPSubscriber(t, "amqpkeys3-test-", func(url string) (*amqp.Subscriber, error) {
		cfg := amqp.NewDurableQueueConfig(url)
		cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
		return amqp.NewSubscriber(cfg, watermill.NopLogger{})
	})

	type delivery struct {
		id          string
		redelivered bool
		err         error
	}
	var (
		mu         sync.Mutex
		runs       = map[string]int{}
		failed     bool
		deliveries = make(chan delivery, 16)
	)
	keytest.Run(t, sub, queue, middleware.Config{PublishedAt: amqpkeys.PublishedAt}, func(msg *message.Message, err error) {
		deliveries <- delivery{msg.Metadata.Get(amqpkeys.MetadataMessageID), amqp.IsMessageRedelivered(msg), err}
	}, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if !failed {
			failed = true
			return errors.New("the first attempt fails")
		}
		runs[msg.UUID]++
		return nil
	})

	amqptest.PublishForeignTwice(t, url, queue) // the producer retries: the same message twice
	var nacked, acked, redeliveredAcked int
	for acked < 2 {
		d := keytest.Await(t, deliveries, 1)[0]
		if d.id != "order-42" {
			t.Fatalf("a delivery with message_id %q", d.id)
		}
		if d.err != nil {
			nacked++
			continue
		}
		acked++
		if d.redelivered {
			redeliveredAcked++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["order-42"] != 1 || len(runs) != 1 || nacked != 1 {
		t.Fatalf("handler runs by UUID = %v after %d nacked deliveries, want order-42 once after one", runs, nacked)
	}
	if redeliveredAcked == 0 {
		t.Error("no acked delivery was marked redelivered: the nacked one did not come back through v3's redelivery")
	}
}
