package publisher_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/publisher"
)

// countingPublisher counts the messages it is asked to publish.
type countingPublisher struct{ n int }

func (p *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n += len(msgs)
	return nil
}

func (p *countingPublisher) Close() error { return nil }

// TestRunLinks: with Tracing.LinkRuns, a publish the store finds done (a
// producer's retry under a new message id) is dropped as a duplicate, and
// its claim span links to the span of the publish that sent the message
// first, with dedup.link=original. Without LinkRuns no span links.
func TestRunLinks(t *testing.T) {
	for _, on := range []bool{true, false} {
		name := "linked"
		if !on {
			name = "unlinked"
		}
		t.Run(name, func(t *testing.T) {
			tr := spantest.NewTraces(t)
			dp, err := publisher.New(publisher.Config{
				Store: testkit.Memstore(t, nil),
				Key:   keyfuncs.Metadata("order_id"),
				Policy: dedup.Policy{
					Logger:  watermill.NopLogger{},
					Tracing: dedup.Tracing{Provider: tr.TP, LinkRuns: on},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			broker := &countingPublisher{}
			pub, err := dp.Decorate(broker)
			if err != nil {
				t.Fatal(err)
			}
			publish := func(run string) trace.SpanContext {
				t.Helper()
				ctx, sc := tr.Span(run)
				msg := message.NewMessage(watermill.NewUUID(), nil)
				msg.Metadata.Set("order_id", "ORD-7")
				msg.SetContext(ctx)
				if err := pub.Publish("orders", msg); err != nil {
					t.Fatalf("%s: %v", run, err)
				}
				return sc
			}
			first := publish("first")
			retry := publish("retry")
			if broker.n != 1 {
				t.Fatalf("the broker got %d messages, want 1", broker.n)
			}

			var claim sdktrace.ReadOnlySpan
			for _, s := range tr.Rec.Ended() {
				if s.Name() == "dedup.claim" && s.Parent().SpanID() == retry.SpanID() {
					claim = s
				}
				if !on && len(s.Links()) != 0 {
					t.Fatalf("%s of an unlinked publish has links: %v", s.Name(), s.Links())
				}
			}
			if claim == nil {
				t.Fatal("no dedup.claim span under the retry's span")
			}
			if !on {
				return
			}
			links := claim.Links()
			if len(links) != 1 {
				t.Fatalf("the retry's claim has %d links, want one to the first publish", len(links))
			}
			l := links[0]
			if l.SpanContext.TraceID() != first.TraceID() || l.SpanContext.SpanID() != first.SpanID() {
				t.Fatalf("the retry's claim links to %s/%s, want the first publish's %s/%s",
					l.SpanContext.TraceID(), l.SpanContext.SpanID(), first.TraceID(), first.SpanID())
			}
			if len(l.Attributes) != 1 || l.Attributes[0].Key != cycle.AttrLink || l.Attributes[0].Value.AsString() != cycle.LinkOriginal {
				t.Fatalf("link attributes %v, want %s=%s", l.Attributes, cycle.AttrLink, cycle.LinkOriginal)
			}
		})
	}
}
