package middleware_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/bench/cases"
)

// BenchmarkMiddleware compares, on the same message-id key and the same
// messages, a bare handler, this middleware with memstore, and Watermill's
// built-in Deduplicator. Every message is new, so each pays a full
// claim + complete (or the Deduplicator's check-and-record). The ./bench
// harness runs the same cases.
func BenchmarkMiddleware(b *testing.B) {
	for _, c := range cases.MiddlewareCases() {
		b.Run(c.Name, func(b *testing.B) { cases.RunMiddleware(b, c) })
	}
}
