package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
)

// The helpers below are the middleware's tests' (in middleware and in
// internal/onstores/middleware, which runs them on every store).

// DedupMiddleware returns the handler middleware of middleware.New(cfg),
// failing t if New refuses cfg.
func DedupMiddleware(t testing.TB, cfg middleware.Config) message.HandlerMiddleware {
	t.Helper()
	mw, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw.Middleware
}

// AsyncMiddleware returns middleware.New(cfg) in ModeAsyncComplete,
// closed at the end of the test.
func AsyncMiddleware(t testing.TB, cfg middleware.Config) *middleware.Middleware {
	t.Helper()
	cfg.Mode = dedup.ModeAsyncComplete
	m, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// NewPubSub returns a gochannel pub/sub closed at the end of the test.
func NewPubSub(t testing.TB) *gochannel.GoChannel {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

// NewRouter returns a router that RunRouter starts.
func NewRouter(t testing.TB) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// RunRouter starts r and stops it at the end of the test.
func RunRouter(t testing.TB, r *message.Router) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(context.Background()); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	select {
	case <-r.Running():
	case <-done: // Run failed before the router started (reported above)
		t.FailNow()
	}
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
}

// Publish publishes msgs to topic on pub, failing t on an error.
func Publish(t testing.TB, pub message.Publisher, topic string, msgs ...*message.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
}

// PublisherFunc is a message.Publisher of one function.
type PublisherFunc func(topic string, msgs ...*message.Message) error

// Publish calls f.
func (f PublisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}

// Close does nothing.
func (PublisherFunc) Close() error { return nil }
