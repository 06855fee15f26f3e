package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// exportedSpan is a span as the stdout exporter writes it (-trace).
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	SpanKind    int
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
	Status struct{ Code string }
	Links  []struct {
		SpanContext struct{ TraceID, SpanID string }
		Attributes  []struct {
			Key   string
			Value struct{ Value any }
		}
	}
}

func (s exportedSpan) attr(key string) (any, bool) {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.Value, true
		}
	}
	return nil, false
}

const handlerSpanName = "handle " + handlerName

func readTrace(t *testing.T, path string) []exportedSpan {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var spans []exportedSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s exportedSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("%s: a line is not a span: %v\n%s", path, err, sc.Text())
		}
		spans = append(spans, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return spans
}

// A trace of the example (-trace) shows, for each delivery, the handler's
// span (started by handlerSpan, before the dedup middleware) and the dedup
// spans under it: claim and complete in lease mode, begin and commit in
// transactional mode; a republished payment's delivery is a duplicate,
// whose claim span links to the handler span of the delivery that ran
// (dedup.link=original), in the first delivery's trace.
func TestExampleTrace(t *testing.T) {
	t.Parallel()
	one := []string{"-events=1", "-republish-rate=0", "-fail-rate=0", "-lost-ack-rate=0", "-concurrency=1"}
	for _, tc := range []struct {
		name     string
		args     []string
		handlers int
		spans    []string // the dedup spans' names, in the order they end
		outcomes []string // of the claims (or begins)
	}{
		{"lease", []string{"-store=memory"}, 1, []string{"dedup.claim", "dedup.complete"}, []string{"claimed"}},
		{"transactional", []string{"-store=sqlite"}, 1, []string{"dedup.begin", "dedup.commit"}, []string{"claimed"}},
		{"async-complete", []string{"-store=memory", "-async-complete"}, 1, []string{"dedup.claim", "dedup.complete"}, []string{"claimed"}},
		{"republished", []string{"-store=memory", "-republish-rate=1"}, 2, []string{"dedup.claim", "dedup.complete", "dedup.claim"}, []string{"claimed", "duplicate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "trace.json")
			args := append(append(slices.Clone(one), tc.args...), "-trace="+path)
			requireOK(t, runExample(t, newTestRunID(), args...))
			spans := readTrace(t, path)

			handlers := map[string]exportedSpan{} // span id -> span
			var dedupSpans []exportedSpan
			for _, s := range spans {
				switch {
				case s.Name == handlerSpanName:
					handlers[s.SpanContext.SpanID] = s
				case strings.HasPrefix(s.Name, "dedup."):
					dedupSpans = append(dedupSpans, s)
				default:
					t.Errorf("unexpected span %q", s.Name)
				}
			}
			if len(handlers) != tc.handlers {
				t.Fatalf("%d %q spans, want %d (one per delivery)\n%+v", len(handlers), handlerSpanName, tc.handlers, spans)
			}
			for _, h := range handlers {
				if h.Parent.SpanID != "0000000000000000" {
					t.Errorf("handler span %s has parent %s: the producer puts no trace context in the messages, so it is a root", h.SpanContext.SpanID, h.Parent.SpanID)
				}
				if h.SpanKind != int(trace.SpanKindConsumer) {
					t.Errorf("handler span: kind %d, want consumer", h.SpanKind)
				}
				if id, _ := h.attr("messaging.message.id"); id == "" || id == nil {
					t.Errorf("handler span lacks messaging.message.id")
				}
			}
			var names, outcomes []string
			for _, s := range dedupSpans {
				names = append(names, s.Name)
				h, ok := handlers[s.Parent.SpanID]
				if !ok || s.Parent.TraceID != h.SpanContext.TraceID || s.SpanContext.TraceID != h.SpanContext.TraceID {
					t.Errorf("%s (trace %s, parent %s) is not a child of a %q span", s.Name, s.SpanContext.TraceID, s.Parent.SpanID, handlerSpanName)
				}
				if scope, _ := s.attr("dedup.scope"); scope != handlerName {
					t.Errorf("%s: dedup.scope %v, want %s", s.Name, scope, handlerName)
				}
				if o, ok := s.attr("dedup.outcome"); ok {
					outcomes = append(outcomes, o.(string))
				}
				if s.Status.Code == "Error" {
					t.Errorf("%s: status Error", s.Name)
				}
			}
			slices.Sort(names)
			want := slices.Sorted(slices.Values(tc.spans))
			if !slices.Equal(names, want) {
				t.Errorf("dedup spans %v, want %v", names, want)
			}
			slices.Sort(outcomes)
			if !slices.Equal(outcomes, tc.outcomes) {
				t.Errorf("dedup.outcome of the claims: %v, want %v", outcomes, tc.outcomes)
			}
			wantDuplicateLinks(t, dedupSpans, handlers)
		})
	}
}

// wantDuplicateLinks checks that each duplicate's claim span links to
// the handler span of the delivery that completed its record, and that
// no other dedup span links anywhere.
func wantDuplicateLinks(t *testing.T, dedupSpans []exportedSpan, handlers map[string]exportedSpan) {
	t.Helper()
	for _, s := range dedupSpans {
		o, _ := s.attr("dedup.outcome")
		if o != "duplicate" {
			if len(s.Links) != 0 {
				t.Errorf("%s (%v) links to %+v", s.Name, o, s.Links)
			}
			continue
		}
		if len(s.Links) != 1 {
			t.Fatalf("the duplicate's %s has %d links, want one to the run that completed the record", s.Name, len(s.Links))
		}
		l := s.Links[0]
		orig, ok := handlers[l.SpanContext.SpanID]
		if !ok || orig.SpanContext.TraceID != l.SpanContext.TraceID || l.SpanContext.SpanID == s.Parent.SpanID {
			t.Errorf("the duplicate's link %+v leads to no other delivery's %q span", l.SpanContext, handlerSpanName)
		}
		if len(l.Attributes) != 1 || l.Attributes[0].Key != "dedup.link" || l.Attributes[0].Value.Value != "original" {
			t.Errorf("the duplicate's link attributes %+v, want dedup.link=original", l.Attributes)
		}
	}
}

// handlerSpan continues the producer's trace from the message's metadata
// (W3C traceparent): the handler's span is a child of the producer's, and
// the dedup spans children of the handler's, as the README's Tracing
// section shows with a trace-propagating middleware.
func TestHandlerSpanContinuesTheProducersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	dedupMW, err := middleware.New(middleware.Config{
		Store:  store,
		Key:    keyfuncs.MessageID(),
		Policy: dedup.Policy{Logger: watermill.NopLogger{}, Tracing: dedup.Tracing{Provider: tp}},
	})
	if err != nil {
		t.Fatal(err)
	}
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(handlerSpan(tp), dedupMW.Middleware)
	handled := make(chan string, 2)
	router.AddNoPublisherHandler(handlerName, "payments", pubSub, func(msg *message.Message) error {
		handled <- trace.SpanContextFromContext(msg.Context()).SpanID().String()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	// stop closes the router, which waits for the handler running: its
	// spans have ended when it returns.
	stop := sync.OnceValue(func() error {
		cancel()
		return <-ran
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
		if err := dedupMW.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	select {
	case <-router.Running():
	case <-time.After(time.Minute):
		t.Fatal("the router did not start")
	}

	// The producer: a span of its own, its context in the metadata.
	pctx, publish := tp.Tracer("producer").Start(context.Background(), "publish payments", trace.WithSpanKind(trace.SpanKindProducer))
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(msg.Metadata))
	publish.End()
	if err := pubSub.Publish("payments", msg); err != nil {
		t.Fatal(err)
	}
	var handlerID string
	select {
	case handlerID = <-handled:
	case <-time.After(time.Minute):
		t.Fatal("the message was not handled")
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	h, ok := byName[handlerSpanName]
	if !ok {
		t.Fatalf("no %q span among %v", handlerSpanName, byName)
	}
	if h.SpanContext().SpanID().String() != handlerID {
		t.Errorf("the handler saw span %s in its context, want the handler span %s", handlerID, h.SpanContext().SpanID())
	}
	if h.Parent().SpanID() != publish.SpanContext().SpanID() || !h.Parent().IsRemote() {
		t.Errorf("handler span's parent %s (remote %v), want the producer's span %s from the metadata", h.Parent().SpanID(), h.Parent().IsRemote(), publish.SpanContext().SpanID())
	}
	for _, name := range []string{"dedup.claim", "dedup.complete"} {
		s, ok := byName[name]
		switch {
		case !ok:
			t.Errorf("no %s span", name)
		case s.Parent().SpanID() != h.SpanContext().SpanID() || s.SpanContext().TraceID() != publish.SpanContext().TraceID():
			t.Errorf("%s: parent %s in trace %s, want the handler span %s in the producer's trace %s", name, s.Parent().SpanID(), s.SpanContext().TraceID(), h.SpanContext().SpanID(), publish.SpanContext().TraceID())
		}
	}
}

// run with -trace flushes the trace and stops the exporter's goroutine
// before it returns.
func TestRunWithTraceStopsEveryGoroutine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the example")
	}
	path := filepath.Join(t.TempDir(), "trace.json")
	args := []string{"-events=20", "-store=memory", "-cleanup", "-run-id=" + newTestRunID(), "-timeout=60s", "-trace=" + path}
	runLeavingNoGoroutine(t, args)
	handlers := 0
	for _, s := range readTrace(t, path) {
		if s.Name == handlerSpanName {
			handlers++
		}
	}
	if handlers < 20 {
		t.Fatalf("%d handler spans in the trace for 20 events: not flushed", handlers)
	}
}

// Without -trace the middleware is the handler itself: no span, no cost.
func TestHandlerSpanOff(t *testing.T) {
	called := false
	h := func(*message.Message) ([]*message.Message, error) { called = true; return nil, errors.New("x") }
	msg := message.NewMessage("1", nil)
	if _, err := handlerSpan(nil)(h)(msg); err == nil || !called {
		t.Fatal("handlerSpan(nil) changed the handler")
	}
	if trace.SpanContextFromContext(msg.Context()).IsValid() {
		t.Fatal("handlerSpan(nil) put a span in the message's context")
	}
}
