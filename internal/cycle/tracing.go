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
	// AttrLink says why a span links to another run's span
	// (dedup.Tracing.LinkRuns): one of the Link values.
	AttrLink = attribute.Key("dedup.link")
)

// The values of AttrLink.
const (
	// LinkOriginal: a duplicate's claim links to the run that completed
	// the message.
	LinkOriginal = "original"
	// LinkExpired: a takeover's claim links to the run whose lease
	// expired.
	LinkExpired = "expired"
	// LinkHolder: an in-progress claim links to the run holding the keys.
	LinkHolder = "holder"
	// LinkTaker: a Complete refused as a lost claim links to the run that
	// took the message over (or completed it since).
	LinkTaker = "taker"
)

// tracing is the cycle's tracer; a zero tracing makes no spans.
type tracing struct {
	tracer trace.Tracer
	base   []attribute.KeyValue // store, mode, side
	keys   bool
	// links: Tracing.LinkRuns; owners, when the store keeps owners, is
	// how a claim keeps its run's trace context.
	links  bool
	owners stores.OwnerClaimer
}

func newTracing(t dedup.Tracing, caps stores.Capabilities, store stores.Store, mode dedup.Mode, side Side) tracing {
	if t.Provider == nil {
		return tracing{}
	}
	kind := caps.Kind
	if kind == "" {
		kind = storeType(store)
	}
	tr := tracing{
		tracer: t.Provider.Tracer(TracerName),
		base:   []attribute.KeyValue{AttrStore.String(kind), AttrMode.String(mode.String()), AttrSide.String(side.Name)},
		keys:   t.RecordKeys,
		links:  t.LinkRuns,
	}
	if oc, ok := store.(stores.OwnerClaimer); ok && t.LinkRuns && caps.Owners {
		tr.owners = oc
	}
	return tr
}

// owner is the owner a claim made in ctx (the message's) keeps: its
// span's trace context, or nil when runs are not linked or the span is
// not valid.
func (c *Cycle) owner(ctx context.Context) []byte {
	if c.tr.owners == nil {
		return nil
	}
	return record.AppendRun(nil, trace.SpanContextFromContext(ctx))
}

// link adds to span a link to the run sc, why being an AttrLink value,
// when sc is valid and not self's span.
func link(span trace.Span, sc, self trace.SpanContext, why string) {
	if !sc.IsValid() || (sc.TraceID() == self.TraceID() && sc.SpanID() == self.SpanID()) {
		return
	}
	span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLink.String(why)}})
}

// linkClaim links the span of a claim made for the message's run self
// to the run its result names, when runs are linked: a duplicate's to
// the run that completed the record, a takeover's to the run whose lease
// expired, an in-progress claim's to the run holding the keys. span is
// not nil; cl is nil when the claim failed.
func (c *Cycle) linkClaim(span trace.Span, cl *stores.Claim, self trace.SpanContext) {
	if !c.tr.links || cl == nil {
		return
	}
	switch {
	case cl.Result == stores.Duplicate:
		sc, _ := record.RunOf(cl.Data)
		link(span, sc, self, LinkOriginal)
	case cl.Result == stores.Claimed && cl.Takeover:
		sc, _ := record.ParseRun(cl.Owner)
		link(span, sc, self, LinkExpired)
	case cl.Result == stores.InProgress:
		sc, _ := record.ParseRun(cl.Owner)
		link(span, sc, self, LinkHolder)
	}
}

// linkTaker links the span of a Complete refused as a lost claim (nil:
// not kept, runs are not linked) to the run the reconciling claim again
// found: the one that took the message over (in progress) or completed it
// (a duplicate).
func linkTaker(span trace.Span, again *stores.Claim, self trace.SpanContext) {
	if span == nil {
		return
	}
	var sc trace.SpanContext
	switch again.Result {
	case stores.Duplicate:
		sc, _ = record.RunOf(again.Data)
	case stores.InProgress:
		sc, _ = record.ParseRun(again.Owner)
	}
	link(span, sc, self, LinkTaker)
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
	settle(span, err, attrs...)
	span.End()
}

// settle gives span (not nil) err's status and attrs, without ending it.
func settle(span trace.Span, err error, attrs ...attribute.KeyValue) {
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
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
	return c.encode(fingerprint, outputs, trace.SpanContext{})
}

// encode is Encode that also keeps run, the span context of the
// message's span, when runs are linked.
func (c *Cycle) encode(fingerprint []byte, outputs []*message.Message, run trace.SpanContext) []byte {
	if c.tr.tracer == nil {
		return record.Encode(fingerprint, outputs)
	}
	if !c.tr.links {
		run = trace.SpanContext{}
	}
	return record.EncodeRun(fingerprint, outputs, time.Now(), run)
}

// keptSpan is a span whose call has ended but that is ended later, once
// what it links to is known: at the time its call ended, so that its
// duration is the call's.
type keptSpan struct {
	span trace.Span // nil: none kept
	at   time.Time
}

// end ends the kept span, if any, at the time its call ended.
func (k keptSpan) end() {
	if k.span != nil {
		k.span.End(trace.WithTimestamp(k.at))
	}
}
