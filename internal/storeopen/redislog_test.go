package storeopen_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// go-redis's own log lines (its pool's failed dials) go to the program's
// logger, at info level, instead of straight to stderr.
func TestRedisLogRouted(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	storeopen.SetRedisLogger(logger)
	t.Cleanup(func() { storeopen.SetRedisLogger(nil) })
	c := redis.NewClient(&redis.Options{Addr: testkit.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a ping to a closed port succeeded")
	}
	var lines []string
	for _, m := range logger.Captured()[watermill.InfoLogLevel] {
		lines = append(lines, m.Msg)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "failed to dial") {
		t.Fatalf("go-redis's failed dial is not in the logger: %q", lines)
	}
}
