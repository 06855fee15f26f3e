package expiringkeys_test

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/dedup/expiringkeys"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// Two consumers, each with a Deduplicator of its own, share their keys
// through one store: a message the first handled is dropped by the
// second. On redisstore, sqlstore or natsstore the consumers can be
// different processes.
func Example() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	consumer := func(name string) message.HandlerFunc {
		// was: repo, err := wmw.NewMapExpiringKeyRepository(time.Hour)
		repo, err := expiringkeys.New(store, expiringkeys.Config{Scope: "orders", Window: time.Hour})
		if err != nil {
			panic(err)
		}
		d := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherSHA256(math.MaxInt64), Repository: repo}
		// router.AddMiddleware(d.Middleware) in a router; here, by hand:
		return d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			fmt.Printf("%s handles %s\n", name, msg.Payload)
			return nil, nil
		})
	}
	first, second := consumer("consumer A"), consumer("consumer B")

	for _, h := range []message.HandlerFunc{first, second, first} {
		if _, err := h(message.NewMessage("m-1", []byte("order 1842"))); err != nil {
			panic(err)
		}
	}
	if _, err := second(message.NewMessage("m-2", []byte("order 1843"))); err != nil {
		panic(err)
	}
	// Output:
	// consumer A handles order 1842
	// consumer B handles order 1843
}

// Watermill's PublisherDecorator on a Repository: a producer that
// publishes the same payload again within the Window publishes it once,
// however many producers share the store.
func Example_publisherDecorator() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	repo, err := expiringkeys.New(store, expiringkeys.Config{Scope: "publish:orders", Window: time.Hour})
	if err != nil {
		panic(err)
	}
	d := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherSHA256(math.MaxInt64), Repository: repo}
	pub, err := d.PublisherDecorator()(printer{})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"m-1", "m-1-retry", "m-2"} {
		payload := "order 1842"
		if id == "m-2" {
			payload = "order 1843"
		}
		if err := pub.Publish("orders", message.NewMessage(id, []byte(payload))); err != nil {
			panic(err)
		}
	}
	// Output:
	// published m-1: order 1842
	// published m-2: order 1843
}

// printer is a publisher that prints what it publishes.
type printer struct{}

func (printer) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("published %s: %s\n", m.UUID, m.Payload)
	}
	return nil
}

func (printer) Close() error { return nil }
