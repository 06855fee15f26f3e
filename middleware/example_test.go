package middleware_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// A message delivered twice runs its handler once; a failed first attempt
// is released, so its redelivery runs.
func ExampleNew() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	dedupMW, err := middleware.New(middleware.Config{
		Store: store,
		Key: keyfuncs.All(
			keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
			keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
		),
	})
	if err != nil {
		panic(err)
	}

	attempts := 0
	// router.AddMiddleware(dedupMW.Middleware) in a router; here, by hand:
	handler := dedupMW.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempts++
		if attempts == 1 {
			return nil, fmt.Errorf("transient failure")
		}
		fmt.Println("awarding points for", msg.UUID)
		return nil, nil
	})

	msg := message.NewMessage("evt-1", []byte(`{"payment_id":"PAY-1842","amount":120}`))
	for range 3 { // a failed attempt, its redelivery, and a duplicate
		_, err := handler(msg)
		fmt.Println("error:", err)
	}
	// A producer retry: same payment, new message id.
	_, err = handler(message.NewMessage("evt-1-retry", []byte(`{"payment_id":"PAY-1842","amount":120}`)))
	fmt.Println("error:", err)
	// Output:
	// error: transient failure
	// awarding points for evt-1
	// error: <nil>
	// error: <nil>
	// error: <nil>
}

// In ModeAsyncComplete the handler's result goes back to the router (which
// acks) while its record is being completed; Close, once the router has
// stopped, waits for the Completes still in flight.
func ExampleMiddleware_Close() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())

	dedupMW, err := middleware.New(middleware.Config{Store: store, Mode: dedup.ModeAsyncComplete})
	if err != nil {
		panic(err)
	}
	// router.AddMiddleware(dedupMW.Middleware), then router.Run; here, by hand:
	handler := dedupMW.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("handled", msg.UUID)
		return nil, nil
	})
	if _, err := handler(message.NewMessage("evt-1", nil)); err != nil {
		panic(err)
	}

	// After router.Close: every Complete has landed once Close returns.
	if err := dedupMW.Close(context.Background()); err != nil {
		panic(err)
	}
	_, err = handler(message.NewMessage("evt-1", nil)) // a duplicate
	fmt.Println("duplicate acked:", err == nil)
	// Output:
	// handled evt-1
	// duplicate acked: true
}

// With Tracing.LinkRuns, a duplicate's dedup.claim span links to the
// span of the run that handled the message first.
func ExampleNew_linkRuns() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
	rec := tracetest.NewSpanRecorder() // a service exports to its collector
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	dedupMW, err := middleware.New(middleware.Config{Store: store, Policy: dedup.Policy{
		Tracing: dedup.Tracing{Provider: tp, LinkRuns: true},
	}})
	if err != nil {
		panic(err)
	}
	handler := dedupMW.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	runs := map[trace.SpanID]string{}
	for _, run := range []string{"first delivery", "redelivery"} {
		// A trace-propagating middleware puts the run's span in the
		// message's context (see the README's Tracing section).
		ctx, span := tp.Tracer("example").Start(context.Background(), run)
		runs[span.SpanContext().SpanID()] = run
		msg := message.NewMessage("evt-1", nil)
		msg.SetContext(ctx)
		if _, err := handler(msg); err != nil {
			panic(err)
		}
		span.End()
	}
	for _, s := range rec.Ended() {
		for _, l := range s.Links() {
			fmt.Printf("%s of the %s links to the %s (%s)\n", s.Name(), runs[s.Parent().SpanID()], runs[l.SpanContext.SpanID()], l.Attributes[0].Value.AsString())
		}
	}
	// Output:
	// dedup.claim of the redelivery links to the first delivery (original)
}
