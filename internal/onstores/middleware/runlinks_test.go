package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// linkLease is the lease of the run-link tests: long, so that only the
// test ends it (expire), never a slow machine.
const linkLease = time.Minute

// linkStore is a store of the run-link tests on a real service, and the
// way to let a claim's lease run out there.
type linkStore struct {
	store  stores.Store
	expire func(t *testing.T)
}

// openLinkStore opens a store of kind whose leases the test ends: a
// fake clock moved past the lease (memstore, sqlstore, natsstore), or
// the TTL of every record under the test's Redis prefix cut to half a
// lease (a processing record's lease is live while its TTL is longer
// than the lease).
func openLinkStore(t *testing.T, kind anystore.StoreKind) linkStore {
	t.Helper()
	clock := storetest.NewFakeClock(time.Now())
	o := openStoreOf(t, anystore.StoreParams{Kind: kind,
		Memory: memstore.Config{Clock: clock}, SQL: sqlstore.Config{Clock: clock}, NATS: natsstore.Config{Clock: clock}})
	ls := linkStore{store: o.Store, expire: func(*testing.T) { clock.Advance(linkLease + linkLease/2) }}
	if kind == anystore.StoreRedis {
		ls.expire = func(t *testing.T) {
			t.Helper()
			ctx := context.Background()
			keys, err := o.Redis.Keys(ctx, o.Name+"*").Result()
			if err != nil || len(keys) == 0 {
				t.Fatalf("the records under %q: %q, %v", o.Name, keys, err)
			}
			for _, k := range keys {
				if err := o.Redis.PExpire(ctx, k, linkLease/2).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return ls
}

// run is one delivery of a message through the middleware: its handler
// span, and the handler's way to hold the message until released.
type run struct {
	sc       trace.SpanContext
	started  chan struct{}
	release  chan struct{}
	finished chan error
}

// deliver hands a copy of the message uuid, in a context of a span of
// its own on tr, to mw in a goroutine; its handler waits for release.
func deliver(tr *spantest.Traces, mw message.HandlerMiddleware, uuid string) *run {
	msg, sc := tr.Message(uuid)
	r := &run{sc: sc, started: make(chan struct{}), release: make(chan struct{}), finished: make(chan error, 1)}
	h := mw(func(*message.Message) ([]*message.Message, error) {
		close(r.started)
		<-r.release
		return nil, nil
	})
	go func() {
		_, err := h(msg)
		r.finished <- err
	}()
	return r
}

// linksOf returns the links of the dedup spans named name whose parent
// is the span of sc.
func linksOf(spans []sdktrace.ReadOnlySpan, name string, sc trace.SpanContext) ([]sdktrace.Link, bool) {
	for _, s := range spans {
		if s.Name() == name && s.Parent().SpanID() == sc.SpanID() {
			return s.Links(), true
		}
	}
	return nil, false
}

// wantLink checks that links is one link to the span of to, for why.
func wantLink(t *testing.T, what string, links []sdktrace.Link, to trace.SpanContext, why string) {
	t.Helper()
	if len(links) != 1 {
		t.Fatalf("%s: %d links, want one to %s", what, len(links), to.SpanID())
	}
	l := links[0]
	if l.SpanContext.TraceID() != to.TraceID() || l.SpanContext.SpanID() != to.SpanID() {
		t.Fatalf("%s: links to %s/%s, want %s/%s", what, l.SpanContext.TraceID(), l.SpanContext.SpanID(), to.TraceID(), to.SpanID())
	}
	if len(l.Attributes) != 1 || l.Attributes[0].Key != cycle.AttrLink || l.Attributes[0].Value.AsString() != why {
		t.Fatalf("%s: link attributes %v, want %s=%s", what, l.Attributes, cycle.AttrLink, why)
	}
}

// TestRunLinks, on every store on its real service: with
// Tracing.LinkRuns, a run whose lease runs out (a) while it hangs is
// taken over by a second run (b), whose claim span links to a's span; a
// resumes and its Complete, refused as a lost claim, links to b, which
// holds the keys; b completes, and a redelivery (c) is a duplicate whose
// claim span links to b, the run its record names. A claim's processing
// record keeps its run's trace context (the owner an in-progress claim
// sees), and the done record keeps it after the record's time: byte for
// byte record.EncodeRun's, 25 bytes more than without. Without
// LinkRuns, no span links and neither record keeps anything more.
func TestRunLinks(t *testing.T) {
	kinds := []anystore.StoreKind{anystore.StoreMemory, anystore.StoreRedis, anystore.StorePostgres, anystore.StoreMySQL, anystore.StoreSQLite, anystore.StoreNATS}
	for _, kind := range kinds {
		for _, on := range []bool{true, false} {
			name := string(kind) + "/linked"
			if !on {
				name = string(kind) + "/unlinked"
			}
			t.Run(name, func(t *testing.T) { testRunLinks(t, kind, on) })
		}
	}
}

func testRunLinks(t *testing.T, kind anystore.StoreKind, on bool) {
	tr := spantest.NewTraces(t)
	ls := openLinkStore(t, kind)
	scope := "links-" + storetest.NewID()
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: ls.store, Scope: scope, Policy: dedup.Policy{
		Lease: linkLease, Logger: watermill.NopLogger{},
		Tracing: dedup.Tracing{Provider: tr.TP, LinkRuns: on},
		Tuning:  dedup.Tuning{Heartbeat: -1},
	}})
	uuid := "m-" + storetest.NewID()
	keys := []string{uuid}
	ctx := context.Background()
	// peek claims the message's key beside the middleware: it must not
	// get it.
	peek := func(want stores.Result) *stores.Claim {
		t.Helper()
		c, err := ls.store.Claim(ctx, scope, keys, linkLease)
		if err != nil || c.Result != want {
			t.Fatalf("Claim beside the runs = %v, %v; want %s", c, err, want)
		}
		return c
	}
	owner := func(sc trace.SpanContext) []byte {
		if !on {
			return nil
		}
		return record.AppendRun(nil, sc)
	}

	a := deliver(tr, mw, uuid)
	<-a.started
	if c := peek(stores.InProgress); !bytes.Equal(c.Owner, owner(a.sc)) {
		t.Fatalf("the owner of a's processing record = %x, want %x", c.Owner, owner(a.sc))
	}
	ls.expire(t)
	b := deliver(tr, mw, uuid)
	<-b.started
	if c := peek(stores.InProgress); !bytes.Equal(c.Owner, owner(b.sc)) {
		t.Fatalf("the owner of b's processing record = %x, want %x", c.Owner, owner(b.sc))
	}
	close(a.release)
	if err := <-a.finished; !errors.Is(err, stores.ErrLostClaim) {
		t.Fatalf("a, taken over, returned %v; want an error wrapping ErrLostClaim", err)
	}
	close(b.release)
	if err := <-b.finished; err != nil {
		t.Fatalf("b: %v", err)
	}
	c := deliver(tr, mw, uuid)
	close(c.release)
	if err := <-c.finished; err != nil {
		t.Fatalf("c: %v", err)
	}
	select {
	case <-c.started:
		t.Fatal("the duplicate c ran its handler")
	default:
	}

	dup := peek(stores.Duplicate)
	at, ok := record.DoneAt(dup.Data)
	if !ok {
		t.Fatalf("the done record keeps no time: %x", dup.Data)
	}
	plain := record.EncodeAt(nil, nil, at)
	want := plain
	if on {
		want = record.EncodeRun(nil, nil, at, b.sc)
		if len(want) != len(plain)+record.RunSize {
			t.Fatalf("a record with the run is %d bytes, without %d: want %d more", len(want), len(plain), record.RunSize)
		}
	}
	if !bytes.Equal(dup.Data, want) {
		t.Fatalf("the done record's data = %x, want %x", dup.Data, want)
	}

	spans := tr.DedupSpans()
	claimB, okB := linksOf(spans, "dedup.claim", b.sc)
	completeA, okA := linksOf(spans, "dedup.complete", a.sc)
	claimC, okC := linksOf(spans, "dedup.claim", c.sc)
	if !okA || !okB || !okC {
		t.Fatalf("spans missing: a's complete %v, b's claim %v, c's claim %v", okA, okB, okC)
	}
	if !on {
		for _, s := range spans {
			if len(s.Links()) != 0 {
				t.Fatalf("%s of an unlinked run has links: %v", s.Name(), s.Links())
			}
		}
		return
	}
	wantLink(t, "b's takeover claim", claimB, a.sc, cycle.LinkExpired)
	wantLink(t, "a's lost Complete", completeA, b.sc, cycle.LinkTaker)
	wantLink(t, "c's duplicate claim", claimC, b.sc, cycle.LinkOriginal)
	for _, s := range spans {
		if s.Name() == "dedup.claim" && s.Parent().SpanID() == c.sc.SpanID() {
			if v, _ := spantest.Attr(s, string(cycle.AttrOutcome)); v.AsString() != dedup.OutcomeDuplicate.String() {
				t.Fatalf("c's claim outcome = %q, want duplicate", v.AsString())
			}
		}
	}
}
