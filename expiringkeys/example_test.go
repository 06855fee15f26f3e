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
