package spantest

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Message returns a message whose context carries a span of its own (the
// handler's, as a tracing middleware or subscriber puts it there).
func (tr *Traces) Message(uuid string) (*message.Message, trace.SpanContext) {
	ctx, sc := tr.Span("handler")
	msg := message.NewMessage(uuid, nil)
	msg.SetContext(ctx)
	return msg, sc
}

// DedupSpans returns the ended dedup spans, then forgets them.
func (tr *Traces) DedupSpans() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.Rec.Ended() {
		if s.InstrumentationScope().Name == "github.com/watermill-dedup/dedup" {
			out = append(out, s)
		}
	}
	tr.Rec.Reset()
	return out
}

// Attr returns the value of the attribute key of s.
func Attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// WantSpan checks a dedup span's name, parent, status and attributes (a
// nil value: no such attribute).
func WantSpan(t testing.TB, s sdktrace.ReadOnlySpan, name string, parent trace.SpanContext, failed bool, attrs map[string]any) {
	t.Helper()
	if s.Name() != name {
		t.Errorf("span %q, want %q", s.Name(), name)
	}
	if parent.IsValid() && s.Parent().SpanID() != parent.SpanID() {
		t.Errorf("%s: parent %s, want the message's span %s", name, s.Parent().SpanID(), parent.SpanID())
	}
	if s.SpanKind() != trace.SpanKindClient {
		t.Errorf("%s: kind %s, want client", name, s.SpanKind())
	}
	if got := s.Status().Code == codes.Error; got != failed {
		t.Errorf("%s: status %v, want error=%v", name, s.Status(), failed)
	}
	for k, v := range attrs {
		got, ok := Attr(s, k)
		switch {
		case !ok && v != nil:
			t.Errorf("%s: no attribute %s", name, k)
		case ok && v == nil:
			t.Errorf("%s: attribute %s = %v, want none", name, k, got.Emit())
		case ok && fmt.Sprint(got.AsInterface()) != fmt.Sprint(v):
			t.Errorf("%s: %s = %v, want %v", name, k, got.AsInterface(), v)
		}
	}
}

// Merge returns the attributes of a and b, b's winning.
func Merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
