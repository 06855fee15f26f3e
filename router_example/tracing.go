package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry tracing (-trace), to copy with main.go: a tracer
// provider, and handlerSpan, the middleware that starts the handler's span
// before the dedup middleware runs, so that the dedup spans (dedup.claim,
// dedup.complete; dedup.begin, dedup.commit in transactional mode) are its
// children.

// newTracerProvider writes every span to path as a JSON object a line
// (OpenTelemetry's stdout exporter), or returns nil when path is empty:
// no tracing. The spans are flushed and the file closed by closers. A
// service exports to its collector instead (otlptracegrpc, say) and
// usually sets the provider globally (otel.SetTracerProvider).
func newTracerProvider(path string, closers *teardown) (trace.TracerProvider, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cannot write the trace (change -trace): %w", err)
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "router_example"))),
	)
	closers.add("flush the trace to "+path, func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), f.Close())
	})
	return tp, nil
}

// handlerSpan is a trace-propagating middleware: it continues the trace
// the producer put in the message's metadata (W3C traceparent), if any,
// with a span for the handler's run, and puts that span in the message's
// context, where the middlewares after it (the dedup one) and the handler
// find it. With a nil provider it does nothing.
func handlerSpan(tp trace.TracerProvider) message.HandlerMiddleware {
	if tp == nil {
		return func(h message.HandlerFunc) message.HandlerFunc { return h }
	}
	tracer := tp.Tracer("github.com/watermill-dedup/dedup/router_example")
	propagator := propagation.TraceContext{}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := propagator.Extract(msg.Context(), propagation.MapCarrier(msg.Metadata))
			ctx, span := tracer.Start(ctx, "handle "+message.HandlerNameFromCtx(ctx),
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					attribute.String("messaging.operation.type", "process"),
					attribute.String("messaging.destination.name", message.SubscribeTopicFromCtx(ctx)),
					attribute.String("messaging.message.id", msg.UUID),
				))
			defer span.End()
			msg.SetContext(ctx)
			out, err := h(msg)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return out, err
		}
	}
}
