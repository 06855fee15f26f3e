package middleware_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/dedup/middleware"
)

// BenchmarkMiddleware compares, on the same message-id key and the same
// messages, a bare handler, this middleware with memstore, and Watermill's
// built-in Deduplicator. Every message is new, so each pays a full
// claim + complete (or the Deduplicator's check-and-record).
func BenchmarkMiddleware(b *testing.B) {
	handler := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	cases := []struct {
		name string
		wrap func(b *testing.B) message.HandlerFunc
	}{
		{"bare", func(*testing.B) message.HandlerFunc { return handler }},
		{"dedup-memstore", func(b *testing.B) message.HandlerFunc {
			return dedupMiddleware(b, middleware.Config{Store: newMemstore(b), Scope: "bench", Retention: time.Hour})(handler)
		}},
		{"watermill-deduplicator", func(*testing.B) message.HandlerFunc {
			d := &wmw.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
			return d.Middleware(handler)
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := c.wrap(b)
			msgs := make([]*message.Message, b.N)
			for i := range msgs {
				msgs[i] = message.NewMessage("b0e6c1e4-5f2a-4c0d-9a51-"+strconv.Itoa(100000000000+i), nil)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := h(msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
