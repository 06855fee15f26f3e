package amqpkeys_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/internal/testenv"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
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
	url := testenv.RequireAMQP(t)
	queue := "amqpkeys-test-" + storetest.NewID()
	cfg := amqp.NewDurableQueueConfig(url)
	cfg.Marshaler = amqpkeys.Marshaler{Inner: cfg.Marshaler}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	t.Cleanup(func() { deleteQueue(t, url, queue) })
	if err := sub.SubscribeInitialize(queue); err != nil {
		t.Fatal(err)
	}

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	mw, err := middleware.New(middleware.Config{Store: store, PublishedAt: amqpkeys.PublishedAt})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		runs = map[string]int{}
		acks = make(chan string, 16)
	)
	// Outermost: sees every delivery the router acks, duplicates included.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				acks <- msg.Metadata.Get(amqpkeys.MetadataMessageID)
			}
			return out, err
		}
	})
	router.AddMiddleware(mw)
	router.AddNoPublisherHandler("orders", queue, sub, func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		mu.Unlock()
		return nil
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close(); <-done })
	<-router.Running()

	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for range 2 { // the producer retries: the same message twice
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp091.Publishing{
			MessageId: "order-42", Timestamp: time.Now(), Headers: amqp091.Table{"attempt": int32(1)}, Body: []byte(`{"order":42}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case id := <-acks:
			if id != "order-42" {
				t.Fatalf("acked a delivery with message_id %q", id)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("timed out waiting for both deliveries to be acked")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["order-42"] != 1 || len(runs) != 1 {
		t.Fatalf("handler runs by UUID = %v, want order-42 once", runs)
	}
}

func deleteQueue(t *testing.T, url, queue string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Logf("cleanup: delete queue %s: %v", queue, err)
	}
}
