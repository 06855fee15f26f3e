package publisher_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/publisher"
)

// TestRouterPublisherDecorator: in a router, the consumer middleware
// re-emits a handler's stored outputs on a duplicate delivery (so an
// output whose first publish failed is not lost); with the publisher
// decorator on the router's publisher, an output that was published
// already is not published again.
func TestRouterPublisherDecorator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := newMem(t, nil)
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer ps.Close()
	outputs := &recorder{}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	dedupMW, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{Logger: logger}})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := publisher.New(publisher.Config{Store: store, Policy: dedup.Policy{Logger: logger}})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{}, 8)
	router.AddMiddleware(dedupMW.Middleware)
	// The router applies the first decorator last (outermost): one that
	// reports every publish of outputs (duplicates' re-emitted outputs
	// included) once it has returned, around the dedup decorator.
	router.AddPublisherDecorators(func(pub message.Publisher) (message.Publisher, error) {
		return signalling{pub, handled}, nil
	}, dp.Decorate)
	router.AddHandler("orders", "in", ps, "out", outputs, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	for i := range 3 { // the message and two redeliveries of it
		if err := ps.Publish("in", message.NewMessage("order-1", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatalf("delivery %d was not handled", i+1)
		}
	}
	if got := outputs.uuids(); len(got) != 1 || got[0] != "out-order-1" {
		t.Fatalf("outputs published %v, want [out-order-1] once", got)
	}
}

type signalling struct {
	message.Publisher
	done chan<- struct{}
}

func (s signalling) Publish(topic string, msgs ...*message.Message) error {
	err := s.Publisher.Publish(topic, msgs...)
	s.done <- struct{}{}
	return err
}
