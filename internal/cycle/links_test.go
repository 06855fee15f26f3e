package cycle_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/internal/testkit/spantest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// linked is a tracer provider recording spans, and the runs a test
// makes with it.
type linked struct{ *spantest.Traces }

func newLinked(t *testing.T) *linked { return &linked{spantest.NewTraces(t)} }

// run returns a message whose context carries a span of its own (a run's
// message span), and that span's context.
func (l *linked) run(uuid string) (*message.Message, trace.SpanContext) {
	ctx, sc := l.Span("handler " + uuid)
	msg := newMsg(uuid)
	msg.SetContext(ctx)
	return msg, sc
}

// span returns the one ended span named name whose parent is sc's span.
func (l *linked) span(t *testing.T, name string, sc trace.SpanContext) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range l.Rec.Ended() {
		if s.Name() == name && s.Parent().SpanID() == sc.SpanID() {
			found = append(found, s)
		}
	}
	if len(found) == 0 {
		t.Fatalf("no %s span of run %s", name, sc.SpanID())
	}
	return found[len(found)-1]
}

// wantLinks checks that s links to the spans of to (none when empty),
// each for why.
func wantLinks(t *testing.T, s sdktrace.ReadOnlySpan, why string, to ...trace.SpanContext) {
	t.Helper()
	links := s.Links()
	if len(links) != len(to) {
		t.Fatalf("%s: %d links, want %d", s.Name(), len(links), len(to))
	}
	for i, l := range links {
		if !l.SpanContext.Equal(to[i].WithRemote(true)) {
			t.Fatalf("%s: link %d to %s/%s, want %s/%s", s.Name(), i, l.SpanContext.TraceID(), l.SpanContext.SpanID(), to[i].TraceID(), to[i].SpanID())
		}
		if len(l.Attributes) != 1 || l.Attributes[0].Key != cycle.AttrLink || l.Attributes[0].Value.AsString() != why {
			t.Fatalf("%s: link attributes %v, want %s=%s", s.Name(), l.Attributes, cycle.AttrLink, why)
		}
	}
}

// linkedCycle returns a cycle on store with runs linked.
func (e *env) linkedCycle(l *linked, store stores.Store, links bool) *cycle.Cycle {
	e.t.Helper()
	c, err := cycle.New(store, dedup.Policy{Lease: time.Minute, Metrics: e.metrics, Logger: e.logger,
		Tracing: dedup.Tracing{Provider: l.TP, LinkRuns: links}}, cycle.Consumer, cycle.Needs{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) claimIn(c *cycle.Cycle, msg *message.Message, want stores.Result) *stores.Claim {
	e.t.Helper()
	cl, err := c.Claim(msg.Context(), "s", []string{"k"})
	if err != nil || cl.Result != want {
		e.t.Fatalf("Claim of %s = %v, %v; want %s", msg.UUID, cl, err, want)
	}
	return cl
}

// TestLinkedRuns: with LinkRuns on a store that keeps owners, a claim
// keeps its run's span context on the processing record; the claim that
// finds it in progress links to it (holder), the claim that takes it
// over once the lease ran out links to it (expired); the done record
// keeps the completing run's span context, and a duplicate's claim links
// to it (original), but not a claim of that same run; the Complete of
// the run taken over, refused as a lost claim, links to the run that
// took it over, whether that run still holds the keys or completed them
// (taker).
func TestLinkedRuns(t *testing.T) {
	e, l, c, msgA, a, clA := claimedRun(t, true)
	wantLinks(t, l.span(t, "dedup.claim", a), "")
	if got, _ := e.mem.Claim(context.Background(), "s", []string{"k"}, time.Minute); !bytes.Equal(got.Owner, record.AppendRun(nil, a)) {
		t.Fatalf("the processing record's owner = %x, want a's span context", got.Owner)
	}
	msgB, b := l.run("b")
	e.claimIn(c, msgB, stores.InProgress)
	wantLinks(t, l.span(t, "dedup.claim", b), cycle.LinkHolder, a)

	e.clock.Advance(2 * time.Minute)
	msgC, cc := l.run("c")
	clC := e.claimIn(c, msgC, stores.Claimed)
	wantLinks(t, l.span(t, "dedup.claim", cc), cycle.LinkExpired, a)

	// a resumes while c holds the keys: taken over.
	if r, _ := complete(c, context.WithoutCancel(msgA.Context()), msgA, clA, c.EncodeFor(msgA, nil)); r != cycle.TakenOver {
		t.Fatalf("a's Complete = %v, want TakenOver", r)
	}
	lost := l.span(t, "dedup.complete", a)
	wantLinks(t, lost, cycle.LinkTaker, cc)
	if lost.Status().Code.String() != "Error" {
		t.Fatalf("a's lost Complete: status %v, want an error", lost.Status())
	}

	data := c.EncodeFor(msgC, nil)
	if run, ok := record.RunOf(data); !ok || !run.Equal(cc.WithRemote(true)) {
		t.Fatalf("c's record keeps run %v, %v; want c's span context", run, ok)
	}
	if r, _ := complete(c, context.WithoutCancel(msgC.Context()), msgC, clC, data); r != cycle.Done {
		t.Fatalf("c's Complete = %v, want Done", r)
	}
	wantLinks(t, l.span(t, "dedup.complete", cc), "")
	msgD, d := l.run("d")
	e.claimIn(c, msgD, stores.Duplicate)
	wantLinks(t, l.span(t, "dedup.claim", d), cycle.LinkOriginal, cc)
	e.claimIn(c, msgC, stores.Duplicate)
	wantLinks(t, l.span(t, "dedup.claim", cc), "")

	// a resumes again, c having completed: the lost Complete links to c.
	if r, _ := complete(c, context.WithoutCancel(msgA.Context()), msgA, clA, c.EncodeFor(msgA, nil)); r != cycle.DoneBefore {
		t.Fatalf("a's second Complete = %v, want DoneBefore", r)
	}
	wantLinks(t, l.span(t, "dedup.complete", a), cycle.LinkTaker, cc)
}

// noOwners is a memstore that says it keeps no owners: the cycle must
// not call ClaimOwned.
type noOwners struct{ *memstore.Store }

func (s noOwners) Capabilities() stores.Capabilities {
	c := s.Store.Capabilities()
	c.Owners = false
	return c
}

// TestLinkedRunsWithoutOwners: on a store that keeps no owners (it does
// not implement stores.OwnerClaimer, or says it does not), a linked
// run's claim keeps nothing, and an in-progress claim or a takeover
// links nowhere; the done record still keeps the run, and a duplicate
// still links to it.
func TestLinkedRunsWithoutOwners(t *testing.T) {
	for name, store := range map[string]func(e *env) stores.Store{
		"not an OwnerClaimer": func(e *env) stores.Store { return e.store },
		"Owners false":        func(e *env) stores.Store { return noOwners{e.mem} },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			l := newLinked(t)
			c := e.linkedCycle(l, store(e), true)
			msgA, _ := l.run("a")
			e.claimIn(c, msgA, stores.Claimed)
			if got, _ := e.mem.Claim(context.Background(), "s", []string{"k"}, time.Minute); got.Owner != nil {
				t.Fatalf("the processing record keeps owner %x", got.Owner)
			}
			msgB, b := l.run("b")
			e.claimIn(c, msgB, stores.InProgress)
			wantLinks(t, l.span(t, "dedup.claim", b), "")
			e.clock.Advance(2 * time.Minute)
			msgC, cc := l.run("c")
			clC := e.claimIn(c, msgC, stores.Claimed)
			wantLinks(t, l.span(t, "dedup.claim", cc), "")
			if r, _ := complete(c, context.Background(), msgC, clC, c.EncodeFor(msgC, nil)); r != cycle.Done {
				t.Fatalf("Complete = %v", r)
			}
			msgD, d := l.run("d")
			e.claimIn(c, msgD, stores.Duplicate)
			wantLinks(t, l.span(t, "dedup.claim", d), cycle.LinkOriginal, cc)
		})
	}
}

// TestUnlinkedRuns: without LinkRuns, or without tracing, nothing is
// kept of a run (the record is version 2 with the time, or version 1
// without tracing, byte for byte) and no span links.
func TestUnlinkedRuns(t *testing.T) {
	e, l, c, msgA, a, clA := claimedRun(t, false)
	if got, _ := e.mem.Claim(context.Background(), "s", []string{"k"}, time.Minute); got.Owner != nil {
		t.Fatalf("an unlinked claim keeps owner %x", got.Owner)
	}
	data := c.EncodeFor(msgA, nil)
	at, ok := record.DoneAt(data)
	if !ok || !bytes.Equal(data, record.EncodeAt(nil, nil, at)) {
		t.Fatalf("an unlinked record = %x, want version 2 with its time only", data)
	}
	if _, ok := record.RunOf(data); ok {
		t.Fatal("an unlinked record keeps a run")
	}
	if r, _ := complete(c, context.Background(), msgA, clA, data); r != cycle.Done {
		t.Fatalf("Complete = %v", r)
	}
	// A record a linked run completed links nothing either, unlinked.
	linkedData := e.linkedCycle(l, e.mem, true).EncodeFor(msgA, nil)
	e.clock.Advance(c.Policy().Retention + time.Hour)
	clA = e.claimIn(c, msgA, stores.Claimed)
	if r, _ := complete(c, context.Background(), msgA, clA, linkedData); r != cycle.Done {
		t.Fatalf("Complete = %v", r)
	}
	msgB, b := l.run("b")
	e.claimIn(c, msgB, stores.Duplicate)
	wantLinks(t, l.span(t, "dedup.claim", b), "")
	wantLinks(t, l.span(t, "dedup.claim", a), "")

	untraced, err := cycle.New(e.mem, dedup.Policy{Tracing: dedup.Tracing{LinkRuns: true}}, cycle.Consumer, cycle.Needs{})
	if err != nil {
		t.Fatal(err)
	}
	if data := untraced.EncodeFor(msgA, nil); data != nil {
		t.Fatalf("an untraced record = %x, want none", data)
	}
	if data := untraced.EncodeFor(msgA, []*message.Message{newMsg("out")}); !bytes.Equal(data, record.Encode(nil, []*message.Message{newMsg("out")})) {
		t.Fatalf("an untraced record = %x, want version 1", data)
	}
}

// TestLinkedBegin: a transactional Begin that finds the message done
// links to the run its record names.
func TestLinkedBegin(t *testing.T) {
	e := newEnv(t)
	l := newLinked(t)
	_, orig := l.run("orig")
	done := record.EncodeRun(nil, nil, time.Now(), orig)
	store := &inboxStore{fake: e.store, inbox: true, begin: func(context.Context) (stores.InboxTx, error) { return dupTx{done}, nil }}
	c, err := cycle.New(store, dedup.Policy{Metrics: e.metrics, Tracing: dedup.Tracing{Provider: l.TP, LinkRuns: true}}, cycle.Consumer, cycle.Needs{Mode: dedup.ModeTransactional})
	if err != nil {
		t.Fatal(err)
	}
	msg, run := l.run("dup")
	if _, err := c.Begin(msg.Context(), "s", []string{"k"}); err != nil {
		t.Fatal(err)
	}
	wantLinks(t, l.span(t, "dedup.begin", run), cycle.LinkOriginal, orig)
}

// dupTx is an InboxTx that found its message done with data.
type dupTx struct{ data []byte }

func (dupTx) Result() stores.Result                          { return stores.Duplicate }
func (t dupTx) Data() []byte                                 { return t.data }
func (dupTx) Context(parent context.Context) context.Context { return parent }
func (dupTx) Commit(context.Context, []byte) error           { return nil }
func (dupTx) Rollback(context.Context) error                 { return nil }

// armedClaims notes when a claim starts once armed: the reconciling
// claim after a Complete refused as lost.
type armedClaims struct {
	*memstore.Store
	armed   atomic.Bool
	claimAt atomic.Int64 // Unix nanoseconds of the first armed claim
}

func (s *armedClaims) note() {
	if s.armed.Load() {
		s.claimAt.CompareAndSwap(0, time.Now().UnixNano())
		time.Sleep(time.Millisecond) // the reconcile visibly outlasts the refused call
	}
}

func (s *armedClaims) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	s.note()
	return s.Store.ClaimOwned(ctx, scope, keys, lease, owner)
}

func (s *armedClaims) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	s.note()
	return s.Store.Claim(ctx, scope, keys, lease)
}

// The span of a Complete refused as a lost claim ends when the call
// ended, although it is kept open for the reconcile to link it: its
// duration is the store call's, not the reconcile's.
func TestLostCompleteSpanEndsWithItsCall(t *testing.T) {
	e := newEnv(t)
	l := newLinked(t)
	st := &armedClaims{Store: e.mem}
	c := e.linkedCycle(l, st, true)
	msgA, a := l.run("a")
	clA := e.claimIn(c, msgA, stores.Claimed)
	e.clock.Advance(2 * time.Minute)
	msgC, _ := l.run("c")
	e.claimIn(c, msgC, stores.Claimed)
	st.armed.Store(true)
	complete(c, context.WithoutCancel(msgA.Context()), msgA, clA, c.EncodeFor(msgA, nil))
	s := l.span(t, "dedup.complete", a)
	if st.claimAt.Load() == 0 {
		t.Fatal("no reconciling claim after the refused Complete")
	}
	if at := time.Unix(0, st.claimAt.Load()); s.EndTime().After(at) {
		t.Fatalf("the refused Complete's span ended %s after the reconcile's claim began: it lasts the reconcile", s.EndTime().Sub(at))
	}
}

// claimedRun is a cycle on a memstore, linking runs when links, and the
// claim of key k in scope s by a run a: its message, span context and
// claim.
func claimedRun(t *testing.T, links bool) (*env, *linked, *cycle.Cycle, *message.Message, trace.SpanContext, *stores.Claim) {
	e := newEnv(t)
	l := newLinked(t)
	c := e.linkedCycle(l, e.mem, links)
	msg, sc := l.run("a")
	return e, l, c, msg, sc, e.claimIn(c, msg, stores.Claimed)
}
