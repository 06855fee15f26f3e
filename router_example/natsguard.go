package main

import (
	"runtime"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go/jetstream"
)

// closingGuard wraps the JetStream consumer watermill-nats v2.1.3's
// subscriber consumes from. That subscriber closes its output channel
// when it closes (or its Subscribe context ends) while nats.go may still
// be running its callback for a message that arrived just before: the
// callback's send on the closed channel panics and ends the process
// (`panic: send on closed channel` in jetstream.(*Subscriber).handleMsg),
// at the end of a run or whenever the router closes. The guard recovers
// that one panic and leaves the message unacknowledged: JetStream
// delivers it again after AckWait, to whichever consumer runs then. Any
// other panic goes on.
type closingGuard struct {
	jetstream.Consumer
	logger watermill.LoggerAdapter
}

// Consume runs the subscriber's callback under the guard.
func (g closingGuard) Consume(handler jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return g.Consumer.Consume(func(msg jetstream.Msg) {
		defer func() {
			if r := recover(); r != nil {
				if !sendOnClosedChannel(r) {
					panic(r)
				}
				g.logger.Info("NATS message arrived as the subscriber closed: left unacknowledged, JetStream delivers it again after AckWait",
					watermill.LogFields{"subject": msg.Subject()})
			}
		}()
		handler(msg)
	}, opts...)
}

// sendOnClosedChannel reports whether a recovered value is the runtime's
// panic for a send on a closed channel.
func sendOnClosedChannel(r any) bool {
	err, ok := r.(runtime.Error)
	return ok && err.Error() == "send on closed channel"
}
