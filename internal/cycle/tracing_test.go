package cycle_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/stores"
)

// spans records the spans a cycle ends.
func spans(t *testing.T) (*tracetest.SpanRecorder, dedup.Tracing) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, dedup.Tracing{Provider: tp, RecordKeys: true}
}

// attrs maps a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTracedCalls: with tracing on, every store call of the cycle ends a
// span named for it, with the store, mode, side, scope and keys, and the
// claim's outcome (a duplicate's with the age of its record); a call
// that fails has the error's status. With tracing off, none is made.
func TestTracedCalls(t *testing.T) {
	e := newEnv(t)
	rec, tr := spans(t)
	c := e.cycle(cycle.Consumer, dedup.Policy{Tracing: tr}, cycle.Needs{})
	cl := e.claimed(c, "k")
	if r, _ := complete(c, context.Background(), newMsg("m"), cl, c.Encode(nil, nil)); r != cycle.Done {
		t.Fatalf("Complete = %v", r)
	}
	if dup, err := c.Claim(context.Background(), "s", []string{"k"}); err != nil || dup.Result != stores.Duplicate {
		t.Fatalf("Claim of the completed key = %v, %v", dup, err)
	}
	broken := errors.New("store broke")
	e.store.claim = func(int) (*stores.Claim, error) { return nil, broken }
	if _, err := c.Claim(context.Background(), "s", []string{"x"}); !errors.Is(err, broken) {
		t.Fatalf("Claim on a broken store = %v", err)
	}

	ended := rec.Ended()
	var names []string
	for _, s := range ended {
		names = append(names, s.Name())
	}
	want := []string{"dedup.claim", "dedup.complete", "dedup.claim", "dedup.claim"}
	if len(names) != len(want) {
		t.Fatalf("spans %q, want %q", names, want)
	}
	for i, n := range want {
		if names[i] != n {
			t.Fatalf("spans %q, want %q", names, want)
		}
	}
	first := attrs(ended[0])
	if first[cycle.AttrOutcome].AsString() != dedup.OutcomeClaimed.String() || first[cycle.AttrScope].AsString() != "s" ||
		first[cycle.AttrKeyCount].AsInt64() != 1 || len(first[cycle.AttrKeys].AsStringSlice()) != 1 ||
		first[cycle.AttrSide].AsString() != cycle.Consumer.Name || first[cycle.AttrMode].AsString() == "" || first[cycle.AttrStore].AsString() != e.mem.Capabilities().Kind {
		t.Fatalf("the claim's span: %v", first)
	}
	dup := attrs(ended[2])
	if dup[cycle.AttrOutcome].AsString() != dedup.OutcomeDuplicate.String() {
		t.Fatalf("the duplicate's span: %v", dup)
	}
	if age, ok := dup[cycle.AttrRecordAge]; !ok || age.AsFloat64() < 0 {
		t.Fatalf("the duplicate's span has no record age: %v", dup)
	}
	if st := ended[3].Status(); st.Code != codes.Error || len(ended[3].Events()) == 0 {
		t.Fatalf("the failed claim's span: status %v, %d events; want an error with the error recorded", st, len(ended[3].Events()))
	}
	if ended[1].Status().Code == codes.Error {
		t.Fatalf("the complete's span: status %v", ended[1].Status())
	}

	// Tracing off: no span.
	off := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
	e.store.claim = nil
	e.claimed(off, "untraced")
	if n := len(rec.Ended()); n != len(want) {
		t.Fatalf("%d spans after an untraced claim, want %d", n, len(want))
	}

	// A store without a Kind is named by its type.
	e.store.caps = func(c stores.Capabilities) stores.Capabilities { c.Kind = ""; return c }
	e.claimed(e.cycle(cycle.Consumer, dedup.Policy{Tracing: tr}, cycle.Needs{}), "kindless")
	if ended := rec.Ended(); len(ended) != len(want)+1 || attrs(ended[len(want)])[cycle.AttrStore].AsString() != "*cycle_test.fake" {
		t.Fatalf("the span of a store without a Kind: %d spans, the last %v", len(ended), attrs(ended[len(ended)-1]))
	}
}

// TestTracedBegin: a transactional Begin's span carries its outcome, or
// its failure's.
func TestTracedBegin(t *testing.T) {
	e := newEnv(t)
	rec, tr := spans(t)
	fail := errors.New("begin broke")
	var err error
	store := &inboxStore{fake: e.store, inbox: true, begin: func(context.Context) (stores.InboxTx, error) { return &tx{}, err }}
	c, cerr := cycle.New(store, dedup.Policy{Tracing: tr, Metrics: e.metrics}, cycle.Consumer, cycle.Needs{Mode: dedup.ModeTransactional})
	if cerr != nil {
		t.Fatal(cerr)
	}
	if _, berr := c.Begin(context.Background(), "s", []string{"k"}); berr != nil {
		t.Fatal(berr)
	}
	err = fail
	if _, berr := c.Begin(context.Background(), "s", []string{"k"}); !errors.Is(berr, fail) {
		t.Fatalf("Begin = %v, want %v", berr, fail)
	}
	ended := rec.Ended()
	if len(ended) != 2 || ended[0].Name() != "dedup.begin" {
		t.Fatalf("%d spans, want 2 dedup.begin", len(ended))
	}
	if o := attrs(ended[0])[cycle.AttrOutcome].AsString(); o != dedup.OutcomeClaimed.String() {
		t.Fatalf("the Begin's outcome = %q, want %q", o, dedup.OutcomeClaimed)
	}
	if o := attrs(ended[1])[cycle.AttrOutcome].AsString(); o == "" || o == dedup.OutcomeClaimed.String() || ended[1].Status().Code != codes.Error {
		t.Fatalf("the failed Begin's span: outcome %q, status %v", o, ended[1].Status())
	}
}
