// Package cases holds the benchmark cases shared by the middleware's
// go test benchmarks and the ./bench harness, so both measure the same
// thing.
package cases

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// MiddlewareCase is one way of running a handler.
type MiddlewareCase struct {
	Name string
	// Stateless cases may see the same messages again; the others get a
	// new message (a new UUID) every call.
	Stateless bool
	// New wraps a no-op handler; the returned function releases what New
	// started.
	New func() (message.HandlerFunc, func(), error)
}

func nop(*message.Message) ([]*message.Message, error) { return nil, nil }

// MiddlewareCases compares a bare handler, this middleware on memstore and
// Watermill's built-in Deduplicator, all on the message-id key.
func MiddlewareCases() []MiddlewareCase {
	return []MiddlewareCase{
		{"bare", true, func() (message.HandlerFunc, func(), error) { return nop, func() {}, nil }},
		{"dedup-memstore", false, func() (message.HandlerFunc, func(), error) {
			s, err := memstore.New(memstore.Config{})
			if err != nil {
				return nil, nil, err
			}
			mw, err := middleware.New(middleware.Config{Store: s, Scope: "bench", Policy: dedup.Policy{Retention: time.Hour}})
			if err != nil {
				return nil, nil, err
			}
			return mw.Middleware(nop), func() { _ = s.Close(context.Background()) }, nil
		}},
		{"watermill-deduplicator", false, func() (message.HandlerFunc, func(), error) {
			// Its cleanup goroutine cannot be stopped (it runs on
			// context.Background()); nothing to release.
			d := &wmw.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
			return d.Middleware(nop), func() {}, nil
		}},
	}
}

// Messages fills msgs with messages whose UUID-shaped ids are distinct
// for every first (first, first+1, ...).
func Messages(msgs []*message.Message, first int) {
	for i := range msgs {
		msgs[i] = message.NewMessage("b0e6c1e4-5f2a-4c0d-9a51-"+strconv.Itoa(100000000000+first+i), nil)
	}
}

// chunk bounds the messages made ahead of the timed loop.
const chunk = 1 << 16

// RunMiddleware runs c for b.N new messages, made outside the timed
// region in chunks so memory stays bounded whatever b.N is.
func RunMiddleware(b *testing.B, c MiddlewareCase) {
	h, release, err := c.New()
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	msgs := make([]*message.Message, min(b.N, chunk))
	b.ReportAllocs()
	b.ResetTimer()
	made := false
	for done := 0; done < b.N; done += len(msgs) {
		msgs = msgs[:min(b.N-done, chunk)]
		if !made || !c.Stateless {
			// Outside the timed region; a stateless case reuses the
			// first chunk, or a fast one would spend its time here.
			b.StopTimer()
			Messages(msgs, done)
			// Collect the previous chunk's messages now, so the timed
			// loop pays only for garbage the handler itself makes.
			runtime.GC()
			b.StartTimer()
			made = true
		}
		for _, m := range msgs {
			if _, err := h(m); err != nil {
				b.Fatal(err)
			}
		}
	}
}
