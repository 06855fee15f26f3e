package cycle

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/stores"
)

// The spans of the store calls (dedup.Policy.Tracing): one per call, a
// child of the span in the call's context (the message's), named
// "dedup." and the operation.

// TracerName is the instrumentation scope of the spans.
const TracerName = "github.com/watermill-dedup/dedup"

// Attribute keys of the spans.
const (
	AttrOutcome   = attribute.Key("dedup.outcome")
	AttrScope     = attribute.Key("dedup.scope")
	AttrKeyCount  = attribute.Key("dedup.keys.count")
	AttrKeys      = attribute.Key("dedup.keys")
	AttrStore     = attribute.Key("dedup.store")
	AttrMode      = attribute.Key("dedup.mode")
	AttrSide      = attribute.Key("dedup.side")
	AttrRecordAge = attribute.Key("dedup.record.age")
)

// tracing is the cycle's tracer; a zero tracing makes no spans.
type tracing struct {
	tracer trace.Tracer
	base   []attribute.KeyValue // store, mode, side
	keys   bool
}

func newTracing(t dedup.Tracing, caps stores.Capabilities, store stores.Store, mode dedup.Mode, side Side) tracing {
	if t.Provider == nil {
		return tracing{}
	}
	kind := caps.Kind
	if kind == "" {
		kind = storeType(store)
	}
	return tracing{
		tracer: t.Provider.Tracer(TracerName),
		base:   []attribute.KeyValue{AttrStore.String(kind), AttrMode.String(mode.String()), AttrSide.String(side.Name)},
		keys:   t.RecordKeys,
	}
}

// span starts the span of a store call, or returns ctx and nil when
// tracing is off.
func (c *Cycle) span(ctx context.Context, op, scope string, keys []string) (context.Context, trace.Span) {
	if c.tr.tracer == nil {
		return ctx, nil
	}
	attrs := make([]attribute.KeyValue, 0, len(c.tr.base)+3)
	attrs = append(attrs, c.tr.base...)
	attrs = append(attrs, AttrScope.String(scope), AttrKeyCount.Int(len(keys)))
	if c.tr.keys {
		attrs = append(attrs, AttrKeys.StringSlice(keys))
	}
	return c.tr.tracer.Start(ctx, "dedup."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end ends span (nil: tracing is off) with err's status and attrs.
func end(span trace.Span, err error, attrs ...attribute.KeyValue) {
	if span == nil {
		return
	}
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// claimOutcome is the dedup.outcome of a claim span: what the claim
// decided, or what its failure means for the message (see ClaimFailed).
func (c *Cycle) claimOutcome(msgCtx context.Context, cl *stores.Claim, err error) []attribute.KeyValue {
	if err != nil {
		o, _ := c.failure(msgCtx, err)
		return []attribute.KeyValue{AttrOutcome.String(o.String())}
	}
	switch cl.Result {
	case stores.Claimed:
		if cl.Takeover {
			return []attribute.KeyValue{AttrOutcome.String(dedup.OutcomeTakeover.String())}
		}
		return []attribute.KeyValue{AttrOutcome.String(dedup.OutcomeClaimed.String())}
	case stores.Duplicate:
		attrs := []attribute.KeyValue{AttrOutcome.String(dedup.OutcomeDuplicate.String())}
		if at, ok := record.DoneAt(cl.Data); ok {
			attrs = append(attrs, AttrRecordAge.Float64(time.Since(at).Seconds()))
		}
		return attrs
	case stores.InProgress:
		return []attribute.KeyValue{AttrOutcome.String(dedup.OutcomeInProgress.String())}
	}
	return nil
}

// Encode is the data a done record keeps for a message: its fingerprint
// and outputs, and, when tracing is on, the time it is completed at (for
// dedup.record.age on its duplicates' spans).
func (c *Cycle) Encode(fingerprint []byte, outputs []*message.Message) []byte {
	var at time.Time
	if c.tr.tracer != nil {
		at = time.Now()
	}
	return record.EncodeAt(fingerprint, outputs, at)
}
