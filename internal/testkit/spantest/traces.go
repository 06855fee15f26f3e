package spantest

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Traces is a tracer provider that records every span in memory, shut
// down when the test ends.
type Traces struct {
	Rec *tracetest.SpanRecorder
	TP  *sdktrace.TracerProvider
}

// NewTraces returns a Traces for t.
func NewTraces(t testing.TB) *Traces {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Traces{Rec: rec, TP: tp}
}

// Span starts and ends a span named name and returns a context that
// carries it, as a tracing middleware puts the handler's span in a
// message's context, and its span context.
func (tr *Traces) Span(name string) (context.Context, trace.SpanContext) {
	ctx, span := tr.TP.Tracer("test").Start(context.Background(), name)
	span.End()
	return ctx, span.SpanContext()
}
